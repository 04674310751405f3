"""RecallService.prepare: the lines a later block may quote are counted off the request path."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from policies.recall import Hit, line_message, recall
from policies.types import RecallSpec
from proxy.context.recall import RecallService
from proxy.context.tokens import TiktokenCounter, encoding_name_for, load_encoding
from proxy.store.base import SessionRef
from proxy.store.search import SearchHit
from proxy.telemetry.metrics import Metrics
from tests.policies.test_properties import simple_count
from tests.policies.test_recall import trimmed

REF = SessionRef("t", "s")


class Spy:
    """A tiktoken encoding that records what it was asked to tokenize."""

    def __init__(self) -> None:
        self._inner = load_encoding(encoding_name_for("gpt-4o"))
        self.name = self._inner.name
        self.texts: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.texts.append(text)
        return self._inner.encode_ordinary(text)


class Hits:
    """A recall index that finds messages 5 to 9 of every session."""

    async def search(
        self, session: SessionRef, terms: Sequence[str], *, limit: int, before: int | None = None
    ) -> list[SearchHit]:
        return [SearchHit(100 + i, i, str(i), float(20 - i)) for i in range(5, 10)]


def chat() -> list[dict[str, Any]]:
    """Texts no other test's counter has seen (the process's caches are shared)."""
    tag = uuid.uuid4().hex
    out: list[dict[str, Any]] = [{"role": "system", "content": "You help."}]
    for t in range(20):
        out.append({"role": "user", "content": f"user turn {t} {tag} " + "words " * 10})
        out.append({"role": "assistant", "content": f"answer {t} {tag} " + "more " * 10})
    out.append({"role": "user", "content": "the question about words"})
    return out


async def recalled_lines_tokenized(
    messages: list[dict[str, Any]], prepared: bool
) -> tuple[int, list[str]]:
    """The block's tokens, and the recall lines tokenized on the request's path (a
    counter of its own: a cache of its own)."""
    decision = trimmed(messages, 200)
    spy = Spy()
    counter = TiktokenCounter("gpt-4o", encoding=spy)
    service = RecallService(Hits(), Metrics())  # type: ignore[arg-type]
    if prepared:
        assert await service.prepare(REF, messages, decision, counter) > 0
    spy.texts.clear()
    _, outcome = await service.apply(
        policy="p",
        spec=RecallSpec(share=0.5),
        budget=400,
        ref=REF,
        conversation=messages,
        hashes=[str(i) for i in range(len(messages))],
        decision=decision,
        count=counter.count_message,
        sizes=[simple_count(m) for m in messages],
    )
    assert outcome.status == "recalled"
    return outcome.recalled.tokens, [t for t in spy.texts if t.startswith('{"position":')]


async def test_a_left_out_messages_line_counted_ahead_is_not_tokenized_when_first_quoted():
    messages = chat()
    tokens, on_path = await recalled_lines_tokenized(messages, prepared=True)
    # Without prepare the same block tokenizes its lines on the request's path.
    same_tokens, unprepared = await recalled_lines_tokenized(messages, prepared=False)
    assert on_path == [] and unprepared
    assert tokens == same_tokens


async def test_a_sessions_lines_are_counted_ahead_once():
    messages = chat()
    decision = trimmed(messages, 200)
    counter = TiktokenCounter("gpt-4o", encoding=Spy())
    service = RecallService(Hits(), Metrics())  # type: ignore[arg-type]
    first = await service.prepare(REF, messages, decision, counter)
    assert first == len(decision.dropped)  # each left-out turn, once
    assert await service.prepare(REF, messages, decision, counter) == 0


def test_a_messages_line_is_what_the_block_quotes_and_counts():
    messages = chat()
    decision = trimmed(messages, 200)
    assert line_message(messages, 0) is None  # a system message belongs to no unit
    tool = [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {}}]},
        {"role": "tool", "tool_call_id": "c", "content": "found"},
    ]
    assert line_message(tool, 1) is None and line_message(tool, 2) is None
    out, got = recall(messages, decision, [Hit(7, 3.0)], simple_count, 400, fill=False)
    assert got.position is not None
    block = out.messages[got.position]["content"]
    line = line_message(messages, 7)
    assert line is not None and line["role"] == "user"
    assert line["content"] in block.splitlines()


async def test_counting_ahead_caches_what_counting_on_the_path_gives():
    messages = chat()
    ahead = TiktokenCounter("gpt-4o", encoding=Spy())
    assert await ahead.precount_messages(messages) == len(messages)
    spy = Spy()
    fresh = TiktokenCounter("gpt-4o", encoding=spy)
    ahead_spy = ahead._encoding
    assert isinstance(ahead_spy, Spy)
    ahead_spy.texts.clear()
    assert [ahead.count_message(m) for m in messages] == [fresh.count_message(m) for m in messages]
    assert ahead_spy.texts == [] and spy.texts
