"""What the provider's prompt cache makes of each policy: tokens sent, cached, and paid for.

Replays every conversation of the bench data folder's tau-airline-dev.json and
the bench data folder's locomo-dev.json, one request before each assistant message (a
user turn, and in tau's agent loops each step after a tool result), through
each policy, and sends what the policy forwards to the simulated OpenAI prefix
cache of tests/fakes/prefix_cache.py (the one the tests use: per-conversation
``prompt_cache_key``, 1,024-token minimum, 128-token steps). Prints per
policy: prompt tokens sent, cached, uncached, the share cached, and the
effective input cost in uncached-token units, ``uncached + cached / 10``
(OpenAI's published ratio for cached input on its current models, gpt-4.1 and
gpt-5 families, is a quarter to a tenth of the input price; the targets use a
tenth; the quarter is printed beside it), then checks the issue's targets:

- LoCoMo: the effective cost under ``trim`` with ``low_water`` and under
  ``balanced`` is below passthrough's and below ``trim`` without ``low_water``;
- LoCoMo: under ``trim`` with ``low_water`` at least 70% of the forwarded tokens
  are cached;
- tau: masking lowers the effective cost below trimming's at the same budget.

Summarize policies (and the modes) run offline with the extractive stand-in
summarizer, as ``python -m proxy replay`` does; a request that needs a new
summary waits for it (the proxy's default), so nothing is served by the fallback.

    python bench/cache.py [--markdown]
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
_litellm = importlib.util.find_spec("litellm")
if _litellm is not None and _litellm.origin is not None:
    _tokenizers = Path(_litellm.origin).parent / "litellm_core_utils" / "tokenizers"
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(_tokenizers))
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from bench.datasets import DATA  # noqa: E402
from policies.apply import apply  # noqa: E402
from policies.modes import BALANCED, CONCISE, FULL  # noqa: E402
from policies.summarize import limit_of  # noqa: E402
from policies.trim import budget_limit  # noqa: E402
from policies.types import (  # noqa: E402
    Budget,
    ContextTooLong,
    Decision,
    MaskSpec,
    Message,
    NoneSpec,
    PolicySpec,
    SummarizeSpec,
    TrimSpec,
)
from proxy.context.offline_summaries import OfflineSummaries  # noqa: E402
from proxy.context.tokens import TiktokenCounter  # noqa: E402
from proxy.ops.replay import load_file  # noqa: E402
from proxy.upstream.cache_hints import with_breakpoints  # noqa: E402
from tests.fakes.prefix_cache import AnthropicPrefixCache, Block, OpenAIPrefixCache  # noqa: E402

Conversation = list[dict[str, Any]]
RATIO = 10  # cached input costs a tenth
QUARTER = 4

LOCOMO_BUDGET = 2000
TAU_BUDGET = 4000
MASK = MaskSpec(after_turns=2, min_tokens=100, step_tokens=1024)

LOCOMO_POLICIES: list[tuple[str, PolicySpec]] = [
    ("passthrough", NoneSpec()),
    (f"trim max_tokens={LOCOMO_BUDGET}", TrimSpec(max_tokens=LOCOMO_BUDGET)),
    (
        f"trim max_tokens={LOCOMO_BUDGET} low_water=0.7",
        TrimSpec(max_tokens=LOCOMO_BUDGET, low_water=0.7),
    ),
    ("summarize turns=8 keep=3", SummarizeSpec(trigger_turns=8, keep_last_turns=3)),
    ("mode concise", CONCISE),
    ("mode balanced", BALANCED),
    ("mode full", FULL),
]
TAU_POLICIES: list[tuple[str, PolicySpec]] = [
    *LOCOMO_POLICIES[:1],
    (f"trim max_tokens={TAU_BUDGET}", TrimSpec(max_tokens=TAU_BUDGET)),
    (f"trim max_tokens={TAU_BUDGET} low_water=0.7", TrimSpec(max_tokens=TAU_BUDGET, low_water=0.7)),
    *LOCOMO_POLICIES[3:],
    ("passthrough + mask", NoneSpec(mask_tool_outputs=MASK)),
    (
        f"trim max_tokens={TAU_BUDGET} + mask",
        TrimSpec(max_tokens=TAU_BUDGET, mask_tool_outputs=MASK),
    ),
    (
        f"trim max_tokens={TAU_BUDGET} low_water=0.7 + mask",
        TrimSpec(max_tokens=TAU_BUDGET, low_water=0.7, mask_tool_outputs=MASK),
    ),
    (
        "mask step_tokens=0 (no steps)",
        NoneSpec(mask_tool_outputs=MaskSpec(after_turns=2, min_tokens=100, step_tokens=0)),
    ),
]


# The policies the Anthropic-style table shows (each run twice: without and with breakpoints).
ANTHROPIC_ROWS = frozenset(
    {
        "passthrough",
        f"trim max_tokens={LOCOMO_BUDGET} low_water=0.7",
        f"trim max_tokens={TAU_BUDGET} low_water=0.7",
        "mode balanced",
        f"trim max_tokens={TAU_BUDGET} low_water=0.7 + mask",
    }
)


def load(name: str) -> list[Conversation]:
    return [c.messages for c in load_file(DATA / name) if c.messages]


def requests(conversation: Conversation) -> Iterator[list[Message]]:
    """What an agent sends: everything before each assistant message (after a user
    message, and after each tool result an assistant acts on)."""
    for i, message in enumerate(conversation):
        if message.get("role") == "assistant" and i > 0:
            yield list(conversation[:i])


@dataclass
class Tally:
    requests: int = 0
    refused: int = 0
    full: int = 0
    sent: int = 0
    cached: int = 0
    # Anthropic-style: tokens written to the cache (billed at 1.25x).
    written: int = 0

    @property
    def uncached(self) -> int:
        return self.sent - self.cached

    def cost(self, ratio: int = RATIO) -> float:
        """Effective input cost, in uncached-token units."""
        return self.uncached + self.cached / ratio

    @property
    def share(self) -> float:
        return self.cached / self.sent if self.sent else 0.0


class Blocks:
    """Prompt-cache blocks (content hash, tokens) of forwarded messages, memoised by object."""

    def __init__(self, counter: TiktokenCounter) -> None:
        self.counter = counter
        self.fixed: Block = ("fixed", counter.count_request_fixed({}))
        self._known: dict[int, Block] = {}

    def learn(self, conversation: Conversation) -> None:
        self._known = {id(m): self._block(m) for m in conversation}

    def _block(self, message: Message) -> Block:
        data = orjson.dumps(message, option=orjson.OPT_SORT_KEYS)
        key = hashlib.blake2b(data, digest_size=12).hexdigest()
        return key, self.counter.count_message(message, key)

    def of(self, messages: Sequence[Message]) -> list[Block]:
        known = self._known
        return [self.fixed, *(known.get(id(m)) or self._block(m) for m in messages)]

    def count(self, message: Message) -> int:
        block = self._known.get(id(message))
        return block[1] if block is not None else self._block(message)[1]


def replay(
    conversations: list[Conversation],
    spec: PolicySpec,
    counter: TiktokenCounter,
    anthropic: bool | None = None,
) -> Tally:
    """``anthropic``: None, the OpenAI-style cache; True, Anthropic's with the proxy's
    breakpoints (proxy.upstream.cache_hints); False, Anthropic's without any."""
    tally = Tally()
    blocks = Blocks(counter)
    for n, conversation in enumerate(conversations):
        blocks.learn(conversation)
        cache = OpenAIPrefixCache()
        explicit = AnthropicPrefixCache()
        decide: Callable[[list[Message]], Decision]
        summaries: OfflineSummaries | None = None
        if isinstance(spec, SummarizeSpec):
            budget = Budget(limit=limit_of(spec), fixed=blocks.fixed[1])
            summaries = OfflineSummaries(spec, blocks.count, budget)
            decide = summaries.decide
        else:
            limit = budget_limit(spec, None, 0) if isinstance(spec, TrimSpec) else None
            budget = Budget(limit=limit, fixed=blocks.fixed[1])

            def decide(request: list[Message], budget: Budget = budget) -> Decision:
                return apply(request, spec, blocks.count, budget)

        sent = list(requests(conversation))
        for k, request in enumerate(sent):
            tally.requests += 1
            try:
                decision = decide(request)
            except ContextTooLong:
                tally.refused += 1
                continue
            if anthropic is None:
                result = cache.request(blocks.of(decision.messages), key=str(n))
            else:
                placed = with_breakpoints(decision.messages)[1] if anthropic else []
                # Block 0 is what precedes the messages: message i is block i + 1.
                marks = [i + 1 for i in placed]
                result = explicit.request(blocks.of(decision.messages), marks, key=str(n))
            tally.full += decision.tokens_before
            tally.sent += result.prompt_tokens
            tally.cached += result.cached_tokens
            tally.written += result.written_tokens
            if summaries is not None and k + 1 < len(sent):
                # After the answer: the summary the next request needs, made ahead.
                summaries.prepare(sent[k + 1][:-1])
    return tally


def print_table(name: str, rows: list[tuple[str, Tally]], markdown: bool) -> None:
    base = rows[0][1].cost()
    if markdown:
        print(f"\n**{name}**\n")
        print(
            "| policy | requests (refused) | prompt tokens sent | cached | uncached | cached share "
            "| effective cost (cached at 1/10) | vs passthrough | at 1/4 |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label, t in rows:
            print(
                f"| {label} | {t.requests} ({t.refused}) | {t.sent:,} | {t.cached:,} | {t.uncached:,} "
                f"| {t.share:.1%} | {t.cost():,.0f} | {t.cost() / base:.0%} "
                f"| {t.cost(QUARTER):,.0f} |"
            )
        return
    print(f"\n== {name}")
    header = (
        f"{'policy':44} {'reqs':>5} {'refus':>5} {'sent':>11} {'cached':>11} {'uncached':>10} "
        f"{'cached%':>7} {'cost/10':>11} {'vs pass':>7} {'cost/4':>11}"
    )
    print(header)
    print("-" * len(header))
    for label, t in rows:
        print(
            f"{label:44} {t.requests:5d} {t.refused:5d} {t.sent:11,d} {t.cached:11,d} {t.uncached:10,d} "
            f"{t.share:7.1%} {t.cost():11,.0f} {t.cost() / base:7.0%} {t.cost(QUARTER):11,.0f}"
        )
    if any(t.refused for _, t in rows):
        print("refus: requests refused as too long for the budget (a 400), left out of the sums")


ANTHROPIC_READ = 0.1
ANTHROPIC_WRITE = 1.25


def anthropic_cost(t: Tally) -> float:
    """Input cost in base-price units: reads at 0.1x, writes at 1.25x, the rest at 1x."""
    plain = t.sent - t.cached - t.written
    return plain + ANTHROPIC_READ * t.cached + ANTHROPIC_WRITE * t.written


def print_anthropic(name: str, rows: list[tuple[str, Tally, Tally]], markdown: bool) -> None:
    """Each policy without breakpoints (nothing is cached) and with the proxy's."""
    base = anthropic_cost(rows[0][2])
    if markdown:
        print(f"\n**{name}, Anthropic-style (reads at 0.1x, writes at 1.25x)**\n")
        print(
            "| policy | cost without breakpoints | with the proxy's breakpoints "
            "| read | written | saved |"
        )
        print("|---|---:|---:|---:|---:|---:|")
        for label, off, on in rows:
            saved = 1 - anthropic_cost(on) / off.sent if off.sent else 0.0
            print(
                f"| {label} | {off.sent:,} | {anthropic_cost(on):,.0f} | {on.cached:,} "
                f"| {on.written:,} | {saved:.0%} |"
            )
        return
    print(f"\n== {name}, Anthropic-style: reads 0.1x, writes 1.25x (breakpoints off / on)")
    header = (
        f"{'policy':44} {'off: cost':>11} {'on: cost':>11} {'read':>11} {'written':>10} "
        f"{'saved':>6} {'vs pass':>7}"
    )
    print(header)
    print("-" * len(header))
    for label, off, on in rows:
        saved = 1 - anthropic_cost(on) / off.sent if off.sent else 0.0
        print(
            f"{label:44} {off.sent:11,d} {anthropic_cost(on):11,.0f} {on.cached:11,d} "
            f"{on.written:10,d} {saved:6.0%} {anthropic_cost(on) / base:7.0%}"
        )


def check(label: str, ok: bool, detail: str) -> bool:
    print(f"  [{'met' if ok else 'NOT MET'}] {label}: {detail}")
    return ok


def targets(locomo: dict[str, Tally], tau: dict[str, Tally]) -> bool:
    print(f"\n== targets (effective cost = uncached + cached / {RATIO})")
    passthrough = locomo["passthrough"].cost()
    no_lw = locomo[f"trim max_tokens={LOCOMO_BUDGET}"].cost()
    lw = locomo[f"trim max_tokens={LOCOMO_BUDGET} low_water=0.7"]
    balanced = locomo["mode balanced"].cost()
    ok = True
    for label, cost in (("trim low_water=0.7", lw.cost()), ("mode balanced", balanced)):
        ok &= check(
            f"LoCoMo {label} below passthrough",
            cost < passthrough,
            f"{cost:,.0f} vs {passthrough:,.0f} ({1 - cost / passthrough:.0%} lower)",
        )
        ok &= check(
            f"LoCoMo {label} below trim without low_water",
            cost < no_lw,
            f"{cost:,.0f} vs {no_lw:,.0f} ({1 - cost / no_lw:.0%} lower)",
        )
    ok &= check(
        "LoCoMo trim low_water=0.7: >= 70% of forwarded tokens cached",
        lw.share >= 0.70,
        f"{lw.share:.1%} ({lw.share - 0.70:+.1%} against the target)",
    )
    for plain, masked in (
        (f"trim max_tokens={TAU_BUDGET}", f"trim max_tokens={TAU_BUDGET} + mask"),
        (
            f"trim max_tokens={TAU_BUDGET} low_water=0.7",
            f"trim max_tokens={TAU_BUDGET} low_water=0.7 + mask",
        ),
    ):
        a, b = tau[plain].cost(), tau[masked].cost()
        ok &= check(
            f"tau masking below trimming at the same budget ({plain.removeprefix('trim ')})",
            b < a,
            f"{b:,.0f} vs {a:,.0f} ({1 - b / a:.0%} lower)",
        )
    return ok


def main(argv: Sequence[str] = ()) -> int:
    markdown = "--markdown" in argv
    if not (DATA / "tau-airline-dev.json").exists() or not (DATA / "locomo-dev.json").exists():
        print(f"skipped: the datasets are not in {DATA}")
        return 0
    started = time.perf_counter()
    counter = TiktokenCounter("gpt-4o")
    tau, locomo = load("tau-airline-dev.json"), load("locomo-dev.json")
    print(
        "prompt cache simulated as OpenAI's (tests/fakes/prefix_cache.py): per-conversation key, "
        f"1,024-token minimum, 128-token steps; cost in uncached-token units, cached at 1/{RATIO}"
    )
    results: dict[str, dict[str, Tally]] = {}
    for name, conversations, policies in (
        (f"locomo-dev ({len(locomo)} conversations)", locomo, LOCOMO_POLICIES),
        (f"tau-airline-dev ({len(tau)} conversations)", tau, TAU_POLICIES),
    ):
        rows = [(label, replay(conversations, spec, counter)) for label, spec in policies]
        print_table(name, rows, markdown)
        results[name.split(" ")[0]] = dict(rows)
        explicit = [
            (
                label,
                replay(conversations, spec, counter, anthropic=False),
                replay(conversations, spec, counter, anthropic=True),
            )
            for label, spec in policies
            if label in ANTHROPIC_ROWS
        ]
        print_anthropic(name, explicit, markdown)
    ok = targets(results["locomo-dev"], results["tau-airline-dev"])
    print(f"\n{'all targets met' if ok else 'some targets NOT met (above)'}")
    print(f"{time.perf_counter() - started:.1f} s")
    # A measurement, not a gate: `make bench` runs every bench whatever they find.
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
