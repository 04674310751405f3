"""Replay a conversation through a policy offline, turn by turn, as a client would send it.

Loaders turn files into chat conversations: a JSON list of chat messages, a
tau-bench file (entries with a ``traj``), a LoCoMo file (``conversation`` with
``session_1``, ``session_2``... lists of ``{speaker, dia_id, text}``; the first
speaker is the user), or a session exported by the admin API (JSON Lines).
``replay`` then sends, for each user message, everything up to it through a
``decide`` function (normally ``Rewriter.decide``, the proxy's own code path)
and reports what the policy did (a summarize policy's summaries are kept in
memory by :mod:`proxy.offline_summaries`). Nothing here does I/O besides the
loaders, so benchmarks can reuse it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from policies.types import ContextTooLong, Decision, Message
from proxy.errors import ContextLengthExceeded

Conversation = list[dict[str, Any]]
Decide = Callable[[Sequence[Message]], Decision]


@dataclass(frozen=True)
class NamedConversation:
    name: str
    messages: Conversation


class ReplayFormatError(ValueError):
    """The file is none of the formats replay understands."""


def is_chat(value: object) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value)
    )


def locomo_messages(entry: Mapping[str, Any]) -> Conversation:
    """A LoCoMo conversation as chat messages: the first speaker is the user."""
    return locomo_dialogue(entry)[0]


def locomo_dialogue(entry: Mapping[str, Any]) -> tuple[Conversation, dict[str, int]]:
    """A LoCoMo conversation as chat messages, and the message each turn (``dia_id``) became.

    The first speaker is the user; a system message names the two speakers.
    """
    sessions = entry["conversation"]
    numbers = sorted(
        int(m.group(1))
        for key, value in sessions.items()
        if (m := re.fullmatch(r"session_(\d+)", key)) and isinstance(value, list)
    )
    turns = [turn for n in numbers for turn in sessions[f"session_{n}"]]
    if not turns:
        return [], {}
    first = turns[0]["speaker"]
    other = next((t["speaker"] for t in turns if t["speaker"] != first), "them")
    messages: Conversation = [
        {"role": "system", "content": f"You are {other}, chatting with your friend {first}."}
    ]
    index: dict[str, int] = {}
    for turn in turns:
        text = turn["text"]
        if turn.get("blip_caption"):
            text += f" [shares a photo: {turn['blip_caption']}]"
        if "dia_id" in turn:
            index[turn["dia_id"]] = len(messages)
        messages.append(
            {"role": "user" if turn["speaker"] == first else "assistant", "content": text}
        )
    return messages, index


def conversations_from(data: Any, stem: str = "conversation") -> list[NamedConversation]:
    """Every conversation in parsed JSON, whichever supported format it is."""
    if is_chat(data):
        return [NamedConversation(stem, list(data))]
    entries = data if isinstance(data, list) else [data]
    out: list[NamedConversation] = []
    for i, entry in enumerate(entries):
        if isinstance(entry, Mapping) and is_chat(entry.get("traj")):
            task = entry.get("task_id")
            out.append(
                NamedConversation(f"task {task}" if task is not None else f"#{i}", entry["traj"])
            )
        elif isinstance(entry, Mapping) and isinstance(entry.get("conversation"), Mapping):
            out.append(
                NamedConversation(str(entry.get("sample_id", f"#{i}")), locomo_messages(entry))
            )
        else:
            raise ReplayFormatError(
                f"entry {i} is not a chat message list, a tau-bench entry (traj) "
                "or a LoCoMo entry (conversation)"
            )
    return out


def load_file(path: str | Path) -> list[NamedConversation]:
    """Conversations from a JSON file, or a session exported as JSON Lines."""
    p = Path(path)
    text = p.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [_exported_session(p, text)]
    return conversations_from(data, p.stem)


def _exported_session(p: Path, text: str) -> NamedConversation:
    """A session exported by ``/admin/sessions/.../export``: its stored chain of items."""
    try:
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ReplayFormatError(f"{p} is neither JSON nor JSON Lines: {exc}") from None
    records = [line for line in lines if isinstance(line, dict)]
    items = [r["message"] for r in records if r.get("type") == "item"]
    if not items:
        raise ReplayFormatError(f"{p} holds no exported session items")
    session: dict[str, Any] = next((r for r in records if r.get("type") == "session"), {})
    return NamedConversation(str(session.get("key", p.stem)), items)


def requests(conversation: Sequence[Message]) -> Iterator[list[Message]]:
    """What a client sends: everything up to and including each user message."""
    for i, message in enumerate(conversation):
        if message.get("role") == "user":
            yield list(conversation[: i + 1])


def newest_turn_start(messages: Sequence[Message]) -> int:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return i
    return len(messages)


def common_prefix(a: Sequence[Message], b: Sequence[Message]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x is not y and x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class TurnResult:
    turn: int
    messages_before: int
    messages_after: int
    tokens_before: int
    tokens_after: int
    turns_dropped: int
    messages_dropped: int
    clipped: int
    reason: str | None
    # Tokens of the summary message(s) the policy forwarded (0: none).
    summary_tokens: int
    # Leading messages shared with the previous request's forwarded list ...
    prefix_kept: int
    # ... and that list's length (0 on the first turn).
    previous_sent: int
    # The previous forwarded list minus its newest turn is a prefix of this one:
    # what a provider's prompt cache can reuse.
    prefix_stable: bool
    error: str | None = None
    # Summarize policies: what became of the summary (none, reused, created,
    # fallback: the X-Context-Summary header's values) and why a fallback served.
    summary: str | None = None
    fallback: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay(
    conversation: Sequence[Message],
    decide: Decide,
    answered: Callable[[Sequence[Message]], None] | None = None,
) -> Iterator[TurnResult]:
    """One result per user message, in order; a request that cannot fit reports its error.

    ``answered`` is told the history after each answered request, up to the
    next user message (a summarize policy prepares the next summary then, as
    the proxy does once it has sent the answer).
    """
    previous: list[Message] = []
    for turn, request in enumerate(requests(conversation), start=1):
        if answered is not None and previous:
            answered(request[:-1])
        try:
            decision = decide(request)
        except (ContextLengthExceeded, ContextTooLong) as exc:
            previous = []
            yield TurnResult(
                turn, len(request), 0, 0, 0, 0, 0, 0, None, 0, 0, 0, False, error=str(exc)
            )
            continue
        sent = decision.messages
        keep = previous[: newest_turn_start(previous)]
        summary = decision.extra.get("summary_tokens", 0)
        outcome = decision.extra.get("summary")
        fallback = decision.extra.get("fallback")
        yield TurnResult(
            turn=turn,
            messages_before=len(request),
            messages_after=len(sent),
            tokens_before=decision.tokens_before,
            tokens_after=decision.tokens_after,
            turns_dropped=decision.turns_dropped,
            messages_dropped=len(decision.dropped),
            clipped=len(decision.clipped),
            reason=decision.reason,
            summary_tokens=summary if isinstance(summary, int) else 0,
            prefix_kept=common_prefix(previous, sent),
            previous_sent=len(previous),
            prefix_stable=bool(previous) and common_prefix(keep, sent) == len(keep),
            summary=outcome.get("status") if isinstance(outcome, Mapping) else None,
            fallback=fallback if isinstance(fallback, str) else None,
        )
        previous = sent


_HEAD = (
    f"{'turn':>5} {'msgs':>5} {'sent':>5} {'tokens':>7} {'sent':>7} {'saved':>6} "
    f"{'turns-':>6} {'clip':>4} {'summary':>7} {'prefix':>9} {'stable':>6}"
)
COLUMNS = f"{_HEAD}  reason"
# Summarize policies add what became of the summary (rows with ``summary`` set).
SUMMARY_COLUMNS = f"{_HEAD} {'outcome':>8}  reason"


def format_row(r: TurnResult) -> str:
    if r.error is not None:
        return f"{r.turn:5d} {r.messages_before:5d} {'-':>5}  error: {r.error}"
    saved = 1 - r.tokens_after / r.tokens_before if r.tokens_before else 0.0
    prefix = f"{r.prefix_kept}/{r.previous_sent}" if r.previous_sent else "-"
    stable = ("yes" if r.prefix_stable else "no") if r.previous_sent else "-"
    outcome = "" if r.summary is None else f" {r.summary:>8}"
    reason = r.reason or ""
    if r.fallback is not None:
        reason = f"{reason} ({r.fallback})".lstrip()
    return (
        f"{r.turn:5d} {r.messages_before:5d} {r.messages_after:5d} {r.tokens_before:7d} "
        f"{r.tokens_after:7d} {saved:6.0%} {r.turns_dropped:6d} {r.clipped:4d} "
        f"{r.summary_tokens:7d} {prefix:>9} {stable:>6}{outcome}  {reason}"
    ).rstrip()


def format_totals(results: Sequence[TurnResult]) -> str:
    ok = [r for r in results if r.error is None]
    before = sum(r.tokens_before for r in ok)
    after = sum(r.tokens_after for r in ok)
    pairs = [r for r in ok if r.previous_sent]
    stable = sum(r.prefix_stable for r in pairs)
    saved = f"{1 - after / before:.0%}" if before else "0%"
    stability = f"{stable}/{len(pairs)}" if pairs else "-"
    line = (
        f"{len(results)} turns, {len(results) - len(ok)} refused; tokens sent {after} of "
        f"{before} ({saved} saved); prefix stable on {stability} turns"
    )
    outcomes = [r.summary for r in ok if r.summary is not None]
    if outcomes:
        counts = ", ".join(
            f"{outcomes.count(name)} {name}" for name in ("created", "reused", "fallback")
        )
        line += f"; summary {counts}"
    return line
