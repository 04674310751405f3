"""What each policy costs a local llama.cpp server: prompt tokens it processed vs reused.

Replays the first ``--turns`` turns of the longest LoCoMo conversation
(locomo-dev.json in the bench data folder: bench/datasets.py), one request
before each assistant message,
through the proxy to llama-cpp-python's server with Gemma 3 270M (the one
tests/local/ start: ``n_ctx`` 4096, the ``gemma`` format, one slot), one
policy at a time, each on a fresh proxy (so each starts uncalibrated) and
after a request that empties the server's prefix cache. Answers are one token:
what is measured is the prompt.

Per policy: requests answered (passthrough overflows ``n_ctx`` at some turn:
a 400), prompt tokens the server had to evaluate and those it reused from its
prefix cache (llama-cpp-python reports no ``timings``; its log says, per
request, ``N prefix-match hit, remaining M prompt tokens to eval``), time per
turn, and the budget overshoot (``usage.prompt_tokens`` over the policy's
``max_tokens``) on the first request (calibration not seeded yet) and the worst
after it.

    python bench/local.py [--turns 50] [--budget 600] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.datasets import DATA  # noqa: E402
from proxy.config.loader import parse_config  # noqa: E402
from proxy.ops.replay import load_file  # noqa: E402
from tests.harness import LoopThread, ProxyServer  # noqa: E402
from tests.llama_server import N_CTX, ServerUnavailable, start_llama_server  # noqa: E402


def policies(budget: int) -> dict[str, dict[str, Any]]:
    return {
        "passthrough": {"strategy": "none"},
        "trim max_turns=8": {"strategy": "trim", "max_turns": 8},
        f"trim max_tokens={budget}": {"strategy": "trim", "max_tokens": budget},
        f"trim max_tokens={budget} low_water=0.6": {
            "strategy": "trim",
            "max_tokens": budget,
            "low_water": 0.6,
        },
    }


_HIT = re.compile(rb"(\d+) prefix-match hit, remaining (\d+) prompt tokens to eval")


@dataclass
class Tally:
    answered: int = 0
    refused: int = 0
    evaluated: int = 0
    reused: int = 0
    seconds: list[float] = field(default_factory=list)
    over: list[int] = field(default_factory=list)

    @property
    def skipped_share(self) -> float:
        total = self.evaluated + self.reused
        return self.reused / total if total else 0.0


def conversation() -> list[dict[str, Any]]:
    conversations = [c.messages for c in load_file(DATA / "locomo-dev.json") if c.messages]
    return max(conversations, key=len)


def requests(messages: list[dict[str, Any]], turns: int) -> list[list[dict[str, Any]]]:
    out = [messages[:i] for i, m in enumerate(messages) if m.get("role") == "assistant" and i]
    return out[:turns]


def log_hits(log: Path, start: int) -> list[tuple[int, int]]:
    """(reused, evaluated) per request the server logged after byte ``start``."""
    with log.open("rb") as f:
        f.seek(start)
        return [(int(a), int(b)) for a, b in _HIT.findall(f.read())]


def run_policy(
    name: str, spec: dict[str, Any], server: Any, loop: LoopThread, tmp: Path, turns: int
) -> Tally:
    config = parse_config(
        {
            "store": {"path": str(tmp / f"{abs(hash(name))}.db")},
            "upstreams": {
                "llama": {
                    "base_url": server.base_url,
                    "timeout_s": 600,
                    "system_messages": "none",
                    "context_window": N_CTX,
                }
            },
            "routes": [{"upstream": "llama", "policy": "p"}],
            "policies": {"p": spec},
            "logging": {"level": "warning"},
        }
    )
    proxy = ProxyServer(loop, config)
    tally = Tally()
    try:
        # Another prompt first: the server's prefix cache holds nothing of this one.
        flush = {"model": "flush", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}
        httpx.post(f"{server.base_url}/chat/completions", json=flush, timeout=600)
        start = server.log.stat().st_size
        for history in requests(conversation(), turns):
            began = time.perf_counter()
            response = httpx.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "gemma", "messages": history, "max_tokens": 1, "temperature": 0},
                headers={"authorization": "Bearer bench", "x-session-id": f"bench-{name}"},
                timeout=600,
            )
            tally.seconds.append(time.perf_counter() - began)
            if response.status_code != 200:
                tally.refused += 1
                continue
            tally.answered += 1
            if "max_tokens" in spec:
                tally.over.append(response.json()["usage"]["prompt_tokens"] - spec["max_tokens"])
            proxy.drain()
        for reused, evaluated in log_hits(server.log, start):
            tally.reused += reused
            tally.evaluated += evaluated
    finally:
        proxy.stop()
    return tally


def table(tallies: dict[str, Tally], markdown: bool) -> str:
    head = (
        "policy",
        "answered",
        "refused",
        "evaluated",
        "reused",
        "reused %",
        "s/turn (median)",
        "overshoot 1st",
        "overshoot after (max)",
    )
    rows = []
    for name, t in tallies.items():
        rows.append(
            (
                name,
                str(t.answered),
                str(t.refused),
                f"{t.evaluated:,}",
                f"{t.reused:,}",
                f"{t.skipped_share:.0%}",
                f"{statistics.median(t.seconds):.2f}" if t.seconds else "-",
                str(t.over[0]) if t.over else "-",
                str(max(t.over[1:])) if len(t.over) > 1 else "-",
            )
        )
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in (head, *rows)
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--budget", type=int, default=600, help="the trim policies' max_tokens")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if not (DATA / "locomo-dev.json").exists():
        print(f"skipped: {DATA / 'locomo-dev.json'} is absent")
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="ctxproxy-local-"))
    try:
        server = start_llama_server(tmp)
    except ServerUnavailable as exc:
        print(f"skipped: {exc}")
        return 0
    loop = LoopThread()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    print(
        f"llama-cpp-python server, Gemma 3 270M Q4_K_M, n_ctx {N_CTX}; started in "
        f"{server.start_s:.1f} s; {args.turns} turns of the longest LoCoMo conversation; "
        f"commit {commit}; {os.cpu_count()} CPUs"
    )
    tallies: dict[str, Tally] = {}
    try:
        for name, spec in policies(args.budget).items():
            tallies[name] = run_policy(name, spec, server, loop, tmp, args.turns)
            # Each policy's row as it is done: a long run interrupted keeps what it measured.
            print(table({name: tallies[name]}, args.markdown).splitlines()[-1], flush=True)
    finally:
        loop.stop()
        server.process.terminate()
        server.process.wait(10)
    print(table(tallies, args.markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
