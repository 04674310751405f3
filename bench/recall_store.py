"""What bench/recall.py and its sections share: a message as stored, its count, a question
asked after its conversation under a recall spec."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.recall_data import Question
from policies.recall import reserve
from policies.trim import trim
from policies.types import Budget, Decision, Message, RecallSpec, TrimSpec
from proxy.context.recall import RecallOutcome, RecallService
from proxy.context.tokens import counter_for
from proxy.http.sessions import content_hash
from proxy.store.base import MessageIn, RequestRecord, SessionRef

NEIGHBORS = 2
MODEL = "gpt-4o"


def record(rid: str) -> RequestRecord:
    return RequestRecord(
        id=rid, tenant="bench", route="bench", policy="bench", model=MODEL, stream=False, status=200
    )


def message_in(message: dict[str, Any]) -> MessageIn:
    counter = counter_for(MODEL)
    return MessageIn(
        message, content_hash(message), str(message["role"]), counter.count_message(message)
    )


def counting(stored: list[MessageIn]) -> tuple[list[int], Callable[[Message], int]]:
    counter = counter_for(MODEL)
    counts = [m.token_count or 0 for m in stored]
    known = {id(m.message): m.token_count or 0 for m in stored}

    def count(message: Message) -> int:
        n = known.get(id(message))
        return counter.count_message(message) if n is None else n

    return counts, count


def session_of(conversations: list[list[dict[str, Any]]], turns: int) -> list[dict[str, Any]]:
    """``turns`` turns (a user and an assistant message each) from the LoCoMo dialogues, cycled."""
    pool = [m for c in conversations for m in c if m["role"] != "system"]
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a friend."}]
    k = 0
    while len(out) < 2 * turns + 1:
        m = pool[k % len(pool)]
        role = "user" if len(out) % 2 == 1 else "assistant"
        out.append({"role": role, "content": f"{m['content']} ({k // len(pool)})"})
        k += 1
    return out


@dataclass(frozen=True)
class Asked:
    """A question asked as the newest user message after its stored conversation."""

    question: Question
    conversation: list[Message]
    hashes: list[str]
    counts: list[int]
    count: Callable[[Message], int]

    @property
    def total(self) -> int:
        return sum(self.counts)


def ask(stored: list[MessageIn], q: Question) -> Asked:
    conv_in = [*stored, message_in(q.message)]
    counts, count = counting(conv_in)
    return Asked(q, [m.message for m in conv_in], [m.content_hash for m in conv_in], counts, count)


async def recall_at(
    service: RecallService,
    spec: RecallSpec,
    limit: int,
    a: Asked,
    windows: dict[int, Decision] | None = None,
    ref: SessionRef | None = None,
) -> tuple[Decision, Decision, RecallOutcome]:
    """(the trimmed window, the decision with recall, the outcome) at ``limit`` tokens.
    ``windows``: the window cut once per reserve (its key) and reused (:func:`window`);
    ``ref``: the stored session (else the question's conversation's)."""
    held = reserve(spec, limit)
    base = windows.get(held) if windows is not None else None
    if base is None:
        base = trim(a.conversation, TrimSpec(max_tokens=limit), a.count, Budget(limit - held))
        if windows is not None:
            windows[held] = base
    decision, outcome = await service.apply(
        policy="bench",
        spec=spec,
        budget=held,
        ref=ref or SessionRef("bench", f"conv-{a.question.conversation}"),
        conversation=a.conversation,
        hashes=a.hashes,
        decision=base,
        count=a.count,
        sizes=a.counts,
    )
    assert decision.tokens_after <= limit, (decision.tokens_after, limit)
    return base, decision, outcome


def window(a: Asked, spec: RecallSpec, limit: int) -> dict[int, Decision]:
    """The trimmed window under ``spec``'s reserve, cut ahead (a timed :func:`recall_at` then
    times the recall step alone)."""
    held = reserve(spec, limit)
    return {held: trim(a.conversation, TrimSpec(max_tokens=limit), a.count, Budget(limit - held))}
