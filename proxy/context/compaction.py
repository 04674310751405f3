"""Compaction answered by the proxy: the session's summary made into one compaction item.

A compaction is the summarize machinery answering on request. The
conversation (the proxy's own earlier items expanded, proxy/context/compaction_item.py)
is planned by :func:`policies.summarize.plan` with a spec that folds every
turn (:func:`policies.compaction.compaction_spec`), so the summary is the
session's incremental stored one: a stored summary of the same conversation
is reused (a retried compaction makes nothing), the newest earlier compaction
(or a stored summary of a prefix) is extended with only the newer turns, and
a new one is made once per range by the summary service (single flight,
the route's circuit breaker, the summarizer's timeout) and stored.

When the summarizer fails, times out or its circuit is open, the offline
extractive summary (quotes, never invented) answers instead, not stored: the
client always gets its one compaction item. Without a session nothing is
stored and the summarizer is called directly, under the same breaker.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.compaction import compaction_spec, fold
from policies.transcript import transcript
from policies.types import Budget, CountFn, Message, SummarizerSpec, SummaryState, SummaryTask
from proxy.context.compaction_item import CompactionPayload, make_item
from proxy.context.offline_summaries import extractive
from proxy.context.summaries import SummaryContext, SummaryService, viewed
from proxy.context.summarizer import (
    EXTRACTIVE_MODEL,
    Summarizer,
    SummaryFailed,
    SummaryOutput,
    SummaryRequest,
)
from proxy.context.summary_chunks import summarize_range
from proxy.store.base import SessionRef, Store, chain_path_hashes
from proxy.telemetry.logging import get_logger

log = get_logger()

NOTHING = "Nothing was said before this point."


@dataclass(frozen=True)
class CompactionInput:
    """One compaction's conversation, as the summary service needs it."""

    ref: SessionRef | None
    items: Sequence[Message]
    # Content hashes of ``items`` (the store's).
    hashes: Sequence[str]
    count: CountFn
    # The chat message each item reads as (the summarizer's transcript).
    view: Callable[[Message], Message]
    summarizer_spec: SummarizerSpec
    # Builds the summarizer, only when one is called.
    summarizer: Callable[[], Summarizer]
    route: str
    # The newest earlier compaction's summary, as a state over ``items``.
    previous: SummaryState | None = None


@dataclass(frozen=True)
class Compaction:
    """What a compaction answered with, and how its summary came to be."""

    item: dict[str, Any]
    payload: CompactionPayload
    # created | waited | reused | fallback | empty (nothing to summarize)
    status: str
    fallback: str | None = None
    summary_id: int | None = None
    wait_ms: float | None = None
    # Items the summary covers, and whether it extended an earlier one.
    covered: int = 0
    incremental: bool = False
    # Items new to this summary (those after what the extended one covered).
    new_items: int = 0
    usage: dict[str, Any] | None = field(default=None)

    def detail(self) -> dict[str, Any]:
        """What the request row says of it (``compaction`` in its detail)."""
        out: dict[str, Any] = {
            "status": self.status,
            "item_id": self.item["id"],
            "covered_items": self.covered,
            "incremental": self.incremental,
            "new_items": self.new_items,
            "summary_chars": len(self.payload.summary),
        }
        for key, value in (
            ("fallback", self.fallback),
            ("summary_id", self.summary_id),
            ("model", self.payload.model),
            ("wait_ms", None if self.wait_ms is None else round(self.wait_ms, 2)),
        ):
            if value is not None:
                out[key] = value
        return out


async def compact(service: SummaryService, given: CompactionInput) -> Compaction:
    """The compaction item for ``given``'s conversation (always one; see the module docstring)."""
    messages, hashes = given.items, given.hashes
    spec = compaction_spec(given.summarizer_spec)
    paths = chain_path_hashes(hashes)
    states = await service.states(given.ref, paths) if given.ref is not None and paths else []
    if given.previous is not None:
        states.append(given.previous)
    planned = fold(messages, given.summarizer_spec, given.count, states)
    task = planned.task
    if task is None:
        reused = planned.reused
        if reused is None:
            return _answer(given, NOTHING, (), "empty", covered=0)
        return _answer(
            given,
            reused.text,
            tuple(f.as_json() for f in reused.facts),
            "reused",
            covered=reused.covers,
            summary_id=reused.id,
            paths=paths,
        )
    facts = tuple(f.as_json() for f in task.facts)
    wait_ms: float | None = None

    def done(
        text: str,
        status: str,
        model: str | None,
        *,
        summary_id: int | None = None,
        fallback: str | None = None,
    ) -> Compaction:
        incremental = task.previous is not None
        return _answer(
            given,
            text,
            facts,
            status,
            covered=task.end,
            paths=paths,
            summary_id=summary_id,
            fallback=fallback,
            wait_ms=wait_ms,
            incremental=incremental,
            new_items=len(task.source),
            model=model,
        )

    failed: SummaryFailed
    if given.ref is not None:
        ctx = SummaryContext(
            ref=given.ref,
            spec=spec,
            messages=messages,
            hashes=hashes,
            count=given.count,
            budget=Budget(),
            summarizer=given.summarizer,
            route=given.route,
            view=given.view,
        )
        made = await service.made(ctx, task, paths)
        wait_ms = made.wait_ms
        if not isinstance(made.result, SummaryFailed):
            stored = made.result
            status = "waited" if made.joined else "created"
            return done(stored.text, status, stored.model, summary_id=stored.id)
        failed = made.result
    else:
        outcome = await _unstored(service, given, messages, task)
        if isinstance(outcome, SummaryOutput):
            return done(outcome.text, "created", outcome.model)
        failed = outcome
    text = _offline(given, messages, task)
    reason = f"summarizer_{failed.reason}"
    return done(text, "fallback", EXTRACTIVE_MODEL, fallback=reason)


async def _unstored(
    service: SummaryService, given: CompactionInput, messages: Sequence[Message], task: SummaryTask
) -> SummaryOutput | SummaryFailed:
    """No session: the summarizer called directly (its breaker, its timeout), nothing stored."""
    if not service.breaker.allow(given.route):
        return SummaryFailed("unavailable", "the circuit is open")
    summarizer = given.summarizer()
    shown = viewed(messages, task.source, given.view)
    previous = task.previous.text if task.previous is not None else None
    making = summarize_range(
        summarizer,
        given.summarizer_spec,
        previous,
        shown,
        task.source,
        task.max_tokens,
        given.count,
    )
    try:
        output = await asyncio.wait_for(making, given.summarizer_spec.timeout_s)
    except TimeoutError:
        service.breaker.failure(given.route)
        return SummaryFailed("timeout", "the compaction stopped waiting")
    except SummaryFailed as exc:
        service.breaker.failure(given.route)
        return exc
    except Exception as exc:  # the boundary: the client gets its item whatever failed
        log.error("compaction_summary_error", error=repr(exc), exc_info=exc)
        service.breaker.failure(given.route)
        return SummaryFailed("error", repr(exc))
    service.breaker.success(given.route)
    return output


def _request(
    given: CompactionInput, messages: Sequence[Message], task: SummaryTask
) -> SummaryRequest:
    shown = viewed(messages, task.source, given.view)
    previous = task.previous.text if task.previous is not None else None
    return SummaryRequest(previous, transcript(shown, task.source), task.max_tokens)


def _offline(given: CompactionInput, messages: Sequence[Message], task: SummaryTask) -> str:
    """The offline extractive summary of the task (the previous summary and quotes)."""
    try:
        return extractive(given.count).make(_request(given, messages, task)).text
    except SummaryFailed:
        return task.previous.text if task.previous is not None else NOTHING


def _answer(
    given: CompactionInput,
    text: str,
    facts: tuple[dict[str, str], ...],
    status: str,
    *,
    covered: int,
    paths: Sequence[str] = (),
    summary_id: int | None = None,
    fallback: str | None = None,
    wait_ms: float | None = None,
    incremental: bool = False,
    new_items: int = 0,
    model: str | None = None,
) -> Compaction:
    payload = CompactionPayload(
        summary=text,
        facts=facts,
        items=covered,
        covers=paths[covered - 1] if covered and paths else None,
        summary_id=summary_id,
        model=model,
        created_at=int(time.time()),
    )
    return Compaction(
        item=make_item(payload),
        payload=payload,
        status=status,
        fallback=fallback,
        summary_id=summary_id,
        wait_ms=wait_ms,
        covered=covered,
        incremental=incremental,
        new_items=new_items,
    )


async def folded_turns(
    store: Store, ref: SessionRef, payload: CompactionPayload
) -> list[dict[str, Any]]:
    """The stored items a compaction item stands for, oldest first ([] when the session's
    stored chain does not hold them: another branch, or the session expired)."""
    if payload.covers is None or not payload.items:
        return []
    chain = await store.history(ref, shared=True)
    if len(chain) < payload.items:
        return []
    paths = chain_path_hashes([item.content_hash for item in chain[: payload.items]])
    if paths[-1] != payload.covers:
        return []
    return [dict(item.message) for item in chain[: payload.items]]
