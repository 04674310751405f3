"""The replay bench for summarization: the summarize policies and the modes, offline.

Each conversation is replayed request by request (everything up to each user
message) as ``python -m proxy replay`` replays a summarize policy
(:mod:`proxy.offline_summaries`): the summaries of earlier requests are its
stored state, the deterministic extractive stand-in
(``proxy.context.summarizer.ExtractiveSummarizer``) is the summarizer. After each
answer, the summary the next request will need is prepared ahead, as the
proxy does (``prefetch``); a request that still needs one "waits".

Per policy: tokens sent vs the full history; summarizer calls, waits, and
the tokens an LLM summarizer would have been sent and have written, per 100
turns; and on LoCoMo the fact retention at each conversation's end: for each
answerable question, whether its answer string, or its evidence turns, are in
what would be forwarded with the last request.

Imported by bench/replay.py (``python bench/replay.py``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from policies.apply import apply
from policies.modes import BALANCED, CONCISE, FULL
from policies.recall import Hit, recall, recall_budget, reserve
from policies.summarize import limit_of
from policies.transcript import message_text
from policies.types import (
    Budget,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    PolicySpec,
    SummarizeSpec,
)
from policies.units import find_orphans
from proxy.context.offline_summaries import OfflineSummaries
from proxy.context.summarizer import DEFAULT_PROMPT, SummaryOutput, SummaryRequest, request_messages
from proxy.context.tokens import TiktokenCounter
from proxy.ops.replay import locomo_dialogue, requests

Conversation = list[dict[str, Any]]

SUMMARIZE_POLICIES: list[tuple[str, SummarizeSpec]] = [
    ("summarize turns=8 keep=3", SummarizeSpec(trigger_turns=8, keep_last_turns=3)),
    (
        "summarize tokens=2000 keep=3",
        SummarizeSpec(trigger_tokens=2000, keep_last_turns=3, summary_share=0.25),
    ),
    ("mode concise", CONCISE),
    ("mode balanced", BALANCED),
    ("mode full", FULL),
]


@dataclass
class Locomo:
    messages: Conversation
    # dia_id -> index of its message.
    turns: dict[str, int]
    questions: list[dict[str, Any]]


def load_locomo(path: Path) -> list[Locomo]:
    """LoCoMo conversations as chat messages (proxy/ops/replay.py's loader), with their QA."""
    out = []
    for entry in json.loads(path.read_text()):
        messages, turns = locomo_dialogue(entry)
        if messages:
            out.append(Locomo(messages, turns, [q for q in entry["qa"] if "answer" in q]))
    return out


def lookup(counter: TiktokenCounter, conversation: Conversation) -> CountFn:
    """Counts by object, computed up front (the proxy's token step), counter as fallback."""
    table = {id(m): counter.count_message(m) for m in conversation}

    def count(message: Message) -> int:
        found = table.get(id(message))
        return found if found is not None else counter.count_message(message)

    return count


@dataclass
class TokenStats:
    """Tokens sent vs the full history, per request and at each conversation's last one."""

    requests: int = 0
    too_long: int = 0
    full: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    last_full: list[int] = field(default_factory=list)
    last_sent: list[int] = field(default_factory=list)


def token_header(width: int) -> str:
    return (
        f"{'policy':{width}} {'reqs':>5} {'400s':>4} {'sent/full mean':>17} {'%':>4} "
        f"{'sent/full last':>17} {'%':>4}"
    )


def token_columns(label: str, width: int, s: TokenStats) -> str:
    sent, full = mean(s.sent), mean(s.full)
    last_sent, last_full = mean(s.last_sent), mean(s.last_full)
    return (
        f"{label:{width}} {s.requests:5d} {s.too_long:4d} "
        f"{sent:8.0f}/{full:8.0f} {100 * sent / full if full else 0:4.0f} "
        f"{last_sent:8.0f}/{last_full:8.0f} {100 * last_sent / last_full if last_full else 0:4.0f}"
    )


def mean(values: list[int] | list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


@dataclass
class SumStats(TokenStats):
    calls: int = 0
    waits: int = 0
    failed: int = 0
    flagged: int = 0
    summarizer_in: int = 0
    summarizer_out: int = 0
    # The last request's forwarded messages, per conversation.
    final: list[list[Message]] = field(default_factory=list)
    # With the policy's recall on top (every dropped message a hit: the worst
    # case for pairing): requests with a recall block, and forwarded lists with
    # an unpaired tool call or result.
    recalled: int = 0
    invalid: int = 0


def replay_summarize(
    conversations: list[Conversation], spec: SummarizeSpec, counter: TiktokenCounter
) -> SumStats:
    stats = SumStats()
    budget = Budget(limit=limit_of(spec), fixed=counter.count_request_fixed({}))

    def measure(request: SummaryRequest, output: SummaryOutput | None) -> None:
        # What an LLM summarizer would be sent (the prompt, the summary so far, the new
        # turns) and would write.
        stats.summarizer_in += counter.count_messages(request_messages(DEFAULT_PROMPT, request))
        if output is not None:
            stats.summarizer_out += counter.count_message({"content": output.text})

    for conversation in conversations:
        summaries = OfflineSummaries(spec, lookup(counter, conversation), budget, on_call=measure)
        sent = list(requests(conversation))
        last: Decision | None = None
        for k, request in enumerate(sent):
            stats.requests += 1
            try:
                decision = summaries.decide(request)
            except ContextTooLong:
                stats.too_long += 1
                continue
            stats.full.append(decision.tokens_before)
            stats.sent.append(decision.tokens_after)
            last = decision
            if spec.recall is not None:
                recall_on_top(stats, spec, request, decision, counter, budget)
            if k + 1 < len(sent):
                # After the answer: the history up to the next user message.
                summaries.prepare(sent[k + 1][:-1])
        stats.calls += summaries.calls
        stats.waits += summaries.waits
        stats.failed += summaries.failed
        if last is not None:
            stats.last_full.append(last.tokens_before)
            stats.last_sent.append(last.tokens_after)
            stats.final.append(last.messages)
    return stats


def recall_on_top(
    stats: SumStats,
    spec: SummarizeSpec,
    request: list[Message],
    decision: Decision,
    counter: TiktokenCounter,
    budget: Budget,
) -> None:
    """The policy's recall over ``decision``: every dropped message a hit (scores arbitrary)."""
    assert spec.recall is not None
    held = reserve(spec.recall, budget.limit)
    room = recall_budget(Budget(budget.limit, budget.fixed, spare=held), decision)
    hits = [Hit(i, float((i * 7919) % 97)) for i in decision.dropped]
    out, got = recall(request, decision, hits, counter.count_message, room)
    stats.recalled += got.position is not None
    stats.invalid += bool(find_orphans(out.messages))


def final_forwarded(
    conversation: Conversation, spec: PolicySpec, counter: TiktokenCounter, limit: int | None
) -> list[Message]:
    """What a stateless policy forwards with the conversation's last request."""
    last = list(requests(conversation))[-1]
    budget = Budget(limit=limit, fixed=counter.count_request_fixed({}))
    try:
        return apply(last, spec, lookup(counter, conversation), budget).messages
    except ContextTooLong:
        return []


@dataclass
class Retention:
    questions: int = 0
    answer: int = 0
    evidence: int = 0
    either: int = 0


def retention(items: list[Locomo], finals: list[list[Message]]) -> Retention:
    """For each answerable question: is its answer, or are its evidence turns, forwarded?"""
    out = Retention()
    for item, forwarded in zip(items, finals, strict=True):
        text = "\n".join(message_text(m) for m in forwarded).lower()
        present = {id(m) for m in forwarded}
        for q in item.questions:
            out.questions += 1
            by_answer = str(q["answer"]).lower() in text
            wanted = [item.turns[e] for e in q.get("evidence", []) if e in item.turns]
            by_evidence = bool(wanted) and all(id(item.messages[i]) in present for i in wanted)
            out.answer += by_answer
            out.evidence += by_evidence
            out.either += by_answer or by_evidence
    return out


def print_summarize_table(name: str, rows: list[tuple[str, SumStats]]) -> None:
    print(f"\n== summarization: {name}")
    header = f"{token_header(30)} {'calls':>6} {'waits':>6} {'in tok':>7} {'out tok':>7}"
    print(header)
    print("-" * len(header))
    for label, s in rows:
        per = 100 / s.requests if s.requests else 0.0
        print(
            f"{token_columns(label, 30, s)} {s.calls * per:6.1f} {s.waits * per:6.1f} "
            f"{s.summarizer_in * per:7.0f} {s.summarizer_out * per:7.0f}"
        )
    for label, s in rows:
        if s.recalled or s.invalid:
            print(
                f"{label}: recall on top (every dropped message a hit, the worst case for "
                f"pairing): {s.recalled} requests with a recall block, {s.invalid} invalid "
                "sequences (an unpaired tool call or result)"
            )
    print(
        "calls, waits (requests that needed a summary not prepared ahead) and the tokens an "
        "LLM summarizer\nwould be sent (in) and write (out) are per 100 turns; "
        "summaries by the extractive stand-in"
    )


def _share(n: int, of: int) -> str:
    return f"{100 * n / of:.1f}%" if of else "-"


def print_retention_table(name: str, rows: list[tuple[str, Retention]]) -> None:
    questions = rows[0][1].questions if rows else 0
    print(f"\n== fact retention at the conversation's end: {name} ({questions} questions)")
    header = f"{'policy':34} {'answer':>7} {'evidence':>9} {'either':>7}"
    print(header)
    print("-" * len(header))
    for label, r in rows:
        answer, evidence, either = (
            _share(n, r.questions) for n in (r.answer, r.evidence, r.either)
        )
        print(f"{label:34} {answer:>7} {evidence:>9} {either:>7}")
    print(
        "answer: the answer string is in the forwarded text; evidence: every evidence turn is "
        "forwarded verbatim"
    )


def run(
    tau: list[Conversation],
    locomo_path: Path,
    counter: TiktokenCounter,
    baselines: list[tuple[str, PolicySpec, int | None]],
) -> None:
    """Every summarize policy on both datasets, then fact retention on LoCoMo."""
    items = load_locomo(locomo_path)
    locomo = [item.messages for item in items]
    print_summarize_table(
        f"tau-airline-dev ({len(tau)} conversations)",
        [(label, replay_summarize(tau, spec, counter)) for label, spec in SUMMARIZE_POLICIES],
    )
    rows = [(label, replay_summarize(locomo, spec, counter)) for label, spec in SUMMARIZE_POLICIES]
    print_summarize_table(f"locomo-dev ({len(locomo)} conversations)", rows)
    kept = [
        (label, retention(items, [final_forwarded(c, spec, counter, limit) for c in locomo]))
        for label, spec, limit in baselines
    ]
    kept += [(label, retention(items, stats.final)) for label, stats in rows]
    print_retention_table(f"locomo-dev ({len(locomo)} conversations)", kept)
