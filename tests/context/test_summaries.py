"""proxy/context/summaries.py: stored summaries found, one call per range, failures, prefetch."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from policies.types import Budget, SummarizerSpec, SummarizeSpec
from proxy.background import Background
from proxy.context.summaries import SummaryContext, SummaryService
from proxy.context.summarizer import SummaryFailed, SummaryOutput, SummaryRequest
from proxy.http.sessions import content_hash
from proxy.store.base import SessionRef, StoredSummary
from proxy.store.memory import MemoryStore
from proxy.telemetry.metrics import Metrics
from tests.policies.test_properties import simple_count

REF = SessionRef("tenant", "s-1")
SPEC = SummarizeSpec(trigger_turns=4, keep_last_turns=2)


class Scripted:
    """A Summarizer that counts its calls and answers as told."""

    model = "fake"
    prompt_hash = "p1"

    def __init__(self, text: str = "they talked", delay: float = 0.0, fail: str | None = None):
        self.text = text
        self.delay = delay
        self.fail = fail
        self.requests: list[SummaryRequest] = []

    async def summarize(self, request: SummaryRequest) -> SummaryOutput:
        self.requests.append(request)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise SummaryFailed(self.fail, "scripted")
        return SummaryOutput(self.text, "fake", {"completion_tokens": 3})


def conversation(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for t in range(turns):
        out += [
            {"role": "user", "content": f"order #{100 + t} question"},
            {"role": "assistant", "content": f"answer {t}"},
        ]
    return [*out, {"role": "user", "content": "new"}]


def ctx(messages: Sequence[dict[str, Any]], summarizer: Scripted, **over: Any) -> SummaryContext:
    fields: dict[str, Any] = {
        "ref": REF,
        "spec": SPEC,
        "messages": messages,
        "hashes": [content_hash(m) for m in messages],
        "count": simple_count,
        "budget": Budget(fixed=3),
        "summarizer": lambda: summarizer,
    }
    fields.update(over)
    return SummaryContext(**fields)


@pytest.fixture
async def service() -> SummaryService:
    return SummaryService(MemoryStore(), Background(), Metrics())


async def test_concurrent_requests_for_one_range_share_one_call(service: SummaryService) -> None:
    summarizer = Scripted(delay=0.05)
    messages = conversation(5)
    outcomes = await asyncio.gather(*(service.decide(ctx(messages, summarizer)) for _ in range(3)))
    assert len(summarizer.requests) == 1
    assert sorted(o.status for o in outcomes) == ["created", "waited", "waited"]
    assert len({o.summary_id for o in outcomes}) == 1
    assert all(o.wait_ms is not None for o in outcomes)
    assert len(await service.store.summaries(REF)) == 1
    assert service.inflight == 0


async def test_a_summary_another_process_stored_meanwhile_is_used_not_remade(
    service: SummaryService,
) -> None:
    store = service.store
    assert isinstance(store, MemoryStore)
    messages = conversation(5)
    first = Scripted("made elsewhere")
    await service.decide(ctx(messages, first))
    (stored,) = await store.summaries(REF)
    # A reader that has not seen it yet: the first lookup misses, the recheck finds it.
    real = store.summaries_for
    misses = [1]

    async def stale(ref: SessionRef, paths: Sequence[str], limit: int = 4) -> list[StoredSummary]:
        if misses:
            misses.pop()
            return []
        return await real(ref, paths, limit)

    store.summaries_for = stale  # type: ignore[method-assign]
    second = Scripted("made here")
    outcome = await service.decide(ctx(messages, second))
    assert second.requests == []
    assert outcome.summary_id == stored.id and outcome.status == "created"
    assert "made elsewhere" in outcome.decision.messages[1]["content"]


async def test_a_failure_falls_back_and_stores_nothing(service: SummaryService) -> None:
    outcome = await service.decide(ctx(conversation(5), Scripted(fail="empty")))
    assert (outcome.status, outcome.fallback) == ("fallback", "summarizer_empty")
    assert outcome.decision.reason == "max_turns"
    assert await service.store.summaries(REF) == []
    assert service.metrics.summaries.value(("failed",)) == 1


async def test_a_summarizer_slower_than_the_timeout_is_not_waited_for(
    service: SummaryService,
) -> None:
    spec = dataclasses.replace(SPEC, summarizer=SummarizerSpec(timeout_s=0.05))
    slow = Scripted(delay=0.3)
    outcome = await service.decide(ctx(conversation(5), slow, spec=spec))
    assert outcome.fallback == "summarizer_timeout"
    # The call goes on in the background; what it makes is there for the next request.
    await service.background.drain()
    assert len(await service.store.summaries(REF)) == 1
    again = await service.decide(ctx(conversation(5), slow, spec=spec))
    assert again.status == "reused" and len(slow.requests) == 1


async def test_a_preview_makes_and_stores_nothing(service: SummaryService) -> None:
    summarizer = Scripted()
    outcome = await service.decide(ctx(conversation(5), summarizer), dry_run=True)
    assert outcome.status == "needed" and outcome.decision.extra["summary_needed"]
    assert summarizer.requests == [] and await service.store.summaries(REF) == []


async def test_without_a_session_nothing_is_made(service: SummaryService) -> None:
    summarizer = Scripted()
    outcome = await service.decide(ctx(conversation(5), summarizer, ref=None, hashes=None))
    assert outcome.fallback == "no_session" and summarizer.requests == []


async def test_after_the_answer_the_next_summary_is_made_in_the_background(
    service: SummaryService,
) -> None:
    summarizer = Scripted()
    messages = conversation(3)  # four turns: within the trigger
    first = await service.decide(ctx(messages, summarizer))
    assert first.status == "none"
    reply = {"role": "assistant", "content": "ok"}
    service.prefetch_after(ctx(messages, summarizer), reply, content_hash(reply))
    await service.background.drain()
    assert len(summarizer.requests) == 1
    nxt = [*messages, reply, {"role": "user", "content": "next"}]
    outcome = await service.decide(ctx(nxt, summarizer))
    assert outcome.status == "reused" and len(summarizer.requests) == 1


async def test_entities_the_summary_invents_are_flagged_in_the_stored_record(
    service: SummaryService,
) -> None:
    invented = Scripted("Customer asked about order #100 and order #999, refund $45.")
    await service.decide(ctx(conversation(5), invented))
    (stored,) = await service.store.summaries(REF)
    assert stored.flagged == ["order #999", "$45"]
    assert {"kind": "id", "value": "order #100"} in stored.facts


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Calls of the planner's ``name`` (plan, prefetch) by the service, one entry each."""
    from proxy.context import summaries

    calls: list[int] = []
    real = getattr(summaries, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(summaries, name, counted)
    return calls


async def test_a_request_planned_before_is_planned_from_the_memo_until_its_summaries_change(
    service: SummaryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = counting(monkeypatch, "plan")
    summarizer = Scripted()
    messages = conversation(5)
    made = await service.decide(ctx(messages, summarizer, model="m"))
    assert made.status == "created" and len(plans) == 1
    first = await service.decide(ctx(messages, summarizer, model="m"))
    assert first.status == "reused" and len(plans) == 2
    # The same history again, in new objects: no plan, the same decision, its own messages.
    again = [dict(m) for m in messages]
    second = await service.decide(ctx(again, summarizer, model="m"))
    assert len(plans) == 2
    assert (second.status, second.summary_id) == (first.status, first.summary_id)
    assert dataclasses.replace(second.decision, messages=[]) == dataclasses.replace(
        first.decision, messages=[]
    )
    assert second.decision.messages == first.decision.messages
    # Each forwarded message is the request's own object, but the summary's.
    own = {id(m) for m in again}
    assert all(id(m) in own or m not in again for m in second.decision.messages)
    # Another budget, another model, or no model: planned again.
    await service.decide(ctx(again, summarizer, model="m", budget=Budget(fixed=4)))
    await service.decide(ctx(again, summarizer, model="n"))
    await service.decide(ctx(again, summarizer))
    assert len(plans) == 5


async def test_a_prefetch_that_found_nothing_to_make_is_not_planned_again(
    service: SummaryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    plans = counting(monkeypatch, "prefetch")
    summarizer = Scripted()
    messages = conversation(1)  # far from the trigger: nothing to make ahead
    reply = {"role": "assistant", "content": "ok"}
    for _ in range(3):
        service.prefetch_after(ctx(messages, summarizer, model="m"), reply, content_hash(reply))
        await service.background.drain()
    assert len(plans) == 1 and summarizer.requests == []
    other = {"role": "assistant", "content": "another answer"}
    service.prefetch_after(ctx(messages, summarizer, model="m"), other, content_hash(other))
    await service.background.drain()
    assert len(plans) == 2


async def test_a_prefetch_planned_idle_before_is_told_with_no_task_and_no_read(
    service: SummaryService, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = service.store
    assert isinstance(store, MemoryStore)
    reads: list[int] = []
    real = store.summaries_for

    async def read(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, "summaries_for", read)
    summarizer = Scripted()
    messages = conversation(1)
    reply = {"role": "assistant", "content": "ok"}
    service.prefetch_after(ctx(messages, summarizer, model="m"), reply, content_hash(reply))
    assert service.background.pending == 1
    await service.background.drain()
    assert len(reads) == 1
    service.prefetch_after(ctx(messages, summarizer, model="m"), reply, content_hash(reply))
    assert service.background.pending == 0 and len(reads) == 1
    # A store that cannot tell without a read (PostgreSQL, Redis): the task reads, as before.
    monkeypatch.setattr(store, "summaries_known", lambda *args, **kwargs: None)
    service.prefetch_after(ctx(messages, summarizer, model="m"), reply, content_hash(reply))
    assert service.background.pending == 1
    await service.background.drain()
    assert len(reads) == 2 and summarizer.requests == []
