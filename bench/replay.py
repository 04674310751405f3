"""Replay real conversations through example policies, one request per user message.

For each dataset (the bench data folder, bench/datasets.py: tau-bench airline, LoCoMo) and policy prints:

- tokens sent vs the full history: mean over requests, and at each
  conversation's last request (mean over conversations);
- prefix stability: the share of consecutive requests of a conversation where
  the previous request's forwarded messages, minus its newest turn (its last
  user message and what follows), are a prefix of the current forwarded list:
  what a provider's prompt cache can reuse;
- policy time per request, mean: with the real counter (cache warm, as in the
  proxy: every message is still hashed to find its count) and with counts
  looked up by object (the policy's own work).

Then the summarize policies and the context modes (bench/replay_summaries.py):
tokens sent, summarizer calls, waits and tokens per 100 turns, and fact
retention on LoCoMo at each conversation's end, beside the trim policies.

Then a scaling check: policy time per request at ~500 messages vs ~20, on a
long conversation made of tau conversations end to end (target <= 3x).

    python bench/replay.py [--door openai|anthropic]

``--door anthropic``: every conversation as an Anthropic Messages request read
by the Messages door (bench/door.py); ``invalid``: forwarded lists the door's
upstream would reject (a tool call without its result, or the reverse).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# Before anything imports litellm or tiktoken: no network, bundled encodings.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
_litellm = importlib.util.find_spec("litellm")
if _litellm is not None and _litellm.origin is not None:
    _tokenizers = Path(_litellm.origin).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_tokenizers))
sys.path.insert(0, str(ROOT))

from bench.datasets import DATA  # noqa: E402
from bench.door import add_door_option, invalid, through  # noqa: E402
from bench.replay_summaries import (  # noqa: E402
    TokenStats,
    lookup,
    mean,
    token_columns,
    token_header,
)
from bench.replay_summaries import run as run_summaries  # noqa: E402
from policies.apply import apply  # noqa: E402
from policies.trim import budget_limit  # noqa: E402
from policies.types import (  # noqa: E402
    Budget,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    NoneSpec,
    PolicySpec,
    TrimSpec,
)
from proxy.context.tokens import TiktokenCounter  # noqa: E402
from proxy.ops.replay import load_file, newest_turn_start, requests  # noqa: E402

Conversation = list[dict[str, Any]]

POLICIES: list[tuple[str, PolicySpec]] = [
    ("passthrough", NoneSpec()),
    ("max_turns=3", TrimSpec(max_turns=3)),
    ("max_tokens=2000", TrimSpec(max_tokens=2000)),
    ("max_tokens=2000 low_water=0.7", TrimSpec(max_tokens=2000, low_water=0.7)),
]
# Only tau has tool output to clip.
CLIPPING: tuple[str, PolicySpec] = (
    "... + tool_output_max_tokens=300",
    TrimSpec(max_tokens=2000, low_water=0.7, tool_output_max_tokens=300),
)
SCALING_TARGET = 3.0


def load(name: str) -> list[Conversation]:
    """Every conversation of a dataset, as proxy/ops/replay.py loads it for `python -m proxy replay`."""
    return [c.messages for c in load_file(DATA / name) if c.messages]


@dataclass
class Stats(TokenStats):
    pairs: int = 0
    stable: int = 0
    micros: list[float] = field(default_factory=list)
    micros_lookup: list[float] = field(default_factory=list)
    invalid: int = 0


def timed(
    request: Sequence[Message], spec: PolicySpec, count: CountFn, budget: Budget
) -> tuple[Decision | ContextTooLong, float]:
    """The policy's decision (or refusal) and the microseconds it took."""
    start = time.perf_counter_ns()
    try:
        result: Decision | ContextTooLong = apply(request, spec, count, budget)
    except ContextTooLong as exc:
        result = exc
    return result, (time.perf_counter_ns() - start) / 1000


def replay(
    conversations: list[Conversation],
    spec: PolicySpec,
    counter: TiktokenCounter,
    door: str = "openai",
) -> Stats:
    stats = Stats()
    fixed = counter.count_request_fixed({})
    limit = budget_limit(spec, None, 0) if isinstance(spec, TrimSpec) else None
    budget = Budget(limit=limit, fixed=fixed)
    for conversation in conversations:
        counter.count_messages(conversation)  # warm: tokenizing is not the policy's cost
        count = lookup(counter, conversation)
        previous: list[Message] | None = None
        last: tuple[int, int] | None = None
        for request in requests(conversation):
            decision, micros = timed(request, spec, counter.count_message, budget)
            _, micros_lookup = timed(request, spec, count, budget)
            stats.requests += 1
            stats.micros.append(micros)
            stats.micros_lookup.append(micros_lookup)
            if isinstance(decision, ContextTooLong):
                stats.too_long += 1
                previous = None
                continue
            stats.full.append(decision.tokens_before)
            stats.sent.append(decision.tokens_after)
            last = (decision.tokens_before, decision.tokens_after)
            forwarded = decision.messages
            stats.invalid += invalid(door, forwarded)
            if previous is not None:
                stats.pairs += 1
                keep = previous[: newest_turn_start(previous)]
                stats.stable += forwarded[: len(keep)] == keep
            previous = forwarded
        if last is not None:
            stats.last_full.append(last[0])
            stats.last_sent.append(last[1])
    return stats


def print_table(name: str, rows: list[tuple[str, Stats]]) -> None:
    print(f"\n== {name}")
    header = f"{token_header(34)} {'stable':>7} {'us/req':>7} {'us/req*':>7} {'invalid':>7}"
    print(header)
    print("-" * len(header))
    for label, s in rows:
        stable = f"{100 * s.stable / s.pairs:.1f}%" if s.pairs else "-"
        print(
            f"{token_columns(label, 34, s)} "
            f"{stable:>7} {mean(s.micros):7.1f} {mean(s.micros_lookup):7.1f} {s.invalid:7d}"
        )
    print("us/req: real counter, cache warm; us/req*: counts looked up by object (policy alone)")


def scaling(tau: list[Conversation], counter: TiktokenCounter) -> bool:
    """Policy time per request at ~500 messages vs ~20, on tau conversations end to end."""
    long: Conversation = [tau[0][0]]
    for conversation in tau:
        long.extend(conversation[1:])
        if len(long) >= 520:
            break
    users = [i for i, m in enumerate(long) if m["role"] == "user"]
    small = long[: min(users, key=lambda i: abs(i - 20)) + 1]
    large = long[: min(users, key=lambda i: abs(i - 500)) + 1]
    counter.count_messages(long)
    count = lookup(counter, long)
    print(f"\n== scaling: {len(small)} vs {len(large)} messages (median of 300 runs each)")
    ok = True
    for label, spec in [*POLICIES[1:], CLIPPING]:
        assert isinstance(spec, TrimSpec)
        budget = Budget(limit=budget_limit(spec, None, 0), fixed=3)
        line = [f"{label:34}"]
        for kind, fn in (("real counter", counter.count_message), ("lookup", count)):
            medians = []
            for request in (small, large):
                samples = [timed(request, spec, fn, budget)[1] for _ in range(300)]
                medians.append(statistics.median(samples))
            ratio = medians[1] / medians[0]
            ok = ok and (kind != "lookup" or ratio <= SCALING_TARGET)
            line.append(f"{kind}: {medians[0]:6.1f} -> {medians[1]:7.1f} us ({ratio:4.1f}x)")
        print("  ".join(line))
    verdict = "met" if ok else "NOT met"
    grew = len(large) / len(small)
    print(f"target <= {SCALING_TARGET:.0f}x for the policy alone (lookup): {verdict}")
    print(f"(the request grew {grew:.0f}x; every message is read and counted once per request)")
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_door_option(parser)
    door = parser.parse_args(argv).door
    if not (DATA / "tau-airline-dev.json").exists() or not (DATA / "locomo-dev.json").exists():
        print(f"skipped: the datasets are not in {DATA}")
        return 0
    started = time.perf_counter()
    counter = TiktokenCounter("gpt-4o")
    tau, locomo = load("tau-airline-dev.json"), load("locomo-dev.json")
    if door != "openai":
        tau = [through(door, c) for c in tau]
        locomo = [through(door, c) for c in locomo]
        print(f"door: {door} (each conversation read by its door's view: bench/door.py)")
    for name, conversations, policies in (
        (f"tau-airline-dev ({len(tau)} conversations)", tau, [*POLICIES, CLIPPING]),
        (f"locomo-dev ({len(locomo)} conversations)", locomo, POLICIES),
    ):
        rows = [(label, replay(conversations, spec, counter, door)) for label, spec in policies]
        print_table(name, rows)
    baselines = [
        (label, spec, budget_limit(spec, None, 0) if isinstance(spec, TrimSpec) else None)
        for label, spec in POLICIES
    ]
    run_summaries(tau, DATA / "locomo-dev.json", counter, baselines)
    scaling(tau, counter)
    print(f"\n{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
