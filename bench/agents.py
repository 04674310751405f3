"""Long tool-using sessions through the proxy, compacted every N tokens as a coding agent does.

Two sets of sessions, replayed as Codex plays them on the Responses API
(``store: false``, the whole history resent every turn, no
``previous_response_id``):

- ``tau``: the tau-bench airline conversations of the bench data folder (bench/datasets.py)
  (tau-airline-dev.json, MIT), chat messages turned into Responses items
  (tool calls into ``function_call``/``function_call_output`` pairs), one fact
  planted in each conversation's first tool output (a booking reference, a
  desk extension, a PIN) and asked about at its end;
- ``codex``: the Codex CLI session recorded through the proxy
  (tests/data/codex-session.json, ``python -m tests.agents.session``): twelve
  notes files read one shell command at a time, each holding one fact.

The client keeps its leading system/developer items and, whenever the items
after them pass N tokens, asks for a compaction as Codex does (a streamed-off
``/v1/responses`` request whose last input item is ``compaction_trigger``),
then carries on with its leading items and the one ``compaction`` item it got
back, nothing else. The proxy answers every compaction (``compaction: proxy``)
with its summarizer ``ctxproxy/extractive`` (the offline quoting summary: no
model is asked); the fake upstream answers each turn with the session's
recorded next output items and never sees a compaction request (one that
reached it counts as ``foreign``).

After the last turn, every fact whose turn a compaction folded away is asked
about (a user question after the history, one request each). A fact counts
as *turn reached* when the words that state it reached the upstream in an
item other than the summary (its turn kept, or quoted in the recall block),
and as *answer reached* when they reached the upstream anywhere (the summary
included): what the summary alone keeps. Rows: no compaction (the whole
history every turn); compaction with the summary alone (no recall);
compaction with recall (``recall: {max_tokens: B}`` on a trim policy that
keeps everything the client sends), one row per budget B. Target: turn
reached >= 90% with recall, at the first budget (1000 by default).

Also per row: tokens forwarded (the upstream's input, tiktoken's count as the
proxy counts items, tool definitions included) and the cached share an
OpenAI-style prefix cache (tests/fakes/prefix_cache.py, per prompt_cache_key)
would serve.

    python bench/agents.py [--every 1500] [--recall 1000 500 2000] [--data DIR]
        [--limit 100] [--facts]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

from bench.agent_sessions import Item, Session, codex_session, tau_sessions, text_item  # noqa: E402
from bench.datasets import DATA  # noqa: E402
from policies.transcript import SUMMARY_HEADER  # noqa: E402
from proxy.responses.items import ItemCounter  # noqa: E402
from proxy.telemetry.logging import configure_logging  # noqa: E402
from tests.fakes.prefix_cache import OpenAIPrefixCache  # noqa: E402
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config  # noqa: E402

COUNTER = ItemCounter("gpt-4o")
TRIGGER: Item = {"type": "compaction_trigger"}


# -- the fake upstream ----------------------------------------------------------------


@dataclass
class Upstream:
    """Answers each turn with the session's next recorded output; prices prompts as OpenAI's cache."""

    script: list[list[Item]] = field(default_factory=list)
    cache: OpenAIPrefixCache = field(default_factory=OpenAIPrefixCache)
    received: list[Item] = field(default_factory=list)
    tokens: int = 0
    cached: int = 0
    foreign: int = 0
    ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self.responses)
        return app

    async def responses(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        self.received.append(body)
        items = body.get("input") or []
        if any(i.get("type") in ("compaction_trigger", "compaction") for i in items):
            self.foreign += 1
            return web.json_response({"error": {"message": "unknown item type"}}, status=400)
        tools = body.get("tools") or []
        blocks = [(hashlib.sha1(orjson.dumps(tools)).hexdigest(), COUNTER.fixed(body))]
        blocks += [(hashlib.sha1(orjson.dumps(i)).hexdigest(), COUNTER.count(i)) for i in items]
        price = self.cache.request(blocks, str(body.get("prompt_cache_key", "")))
        self.tokens += price.prompt_tokens
        self.cached += price.cached_tokens
        output = self.script.pop(0) if self.script else [text_item("assistant", "noted")]
        n = next(self.ids)
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "model": body.get("model", "gpt-4o"),
            "output": output,
            "usage": {
                "input_tokens": price.prompt_tokens,
                "input_tokens_details": {"cached_tokens": price.cached_tokens},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": price.prompt_tokens + 5,
            },
        }
        return web.json_response(response)


# -- the client -----------------------------------------------------------------------


@dataclass
class Outcome:
    sessions: int = 0
    compactions: int = 0
    # Per fact asked about after a compaction folded its turn away:
    # (session, question, its turn reached the upstream, its line reached at all).
    facts: list[tuple[str, str, bool, bool]] = field(default_factory=list)

    @property
    def asked(self) -> int:
        return len(self.facts)

    @property
    def turn_reached(self) -> int:
        return sum(f[2] for f in self.facts)

    @property
    def answer_reached(self) -> int:
        return sum(f[3] for f in self.facts)


def exchanges(items: list[Item]) -> Iterator[tuple[int, int]]:
    """(end of input, end of output) per turn: each run of model output after input."""
    n = len(items)
    i = 0
    while i < n:
        while i < n and _is_input(items[i]):
            i += 1
        start = i
        while i < n and not _is_input(items[i]):
            i += 1
        if i > start:
            yield start, i


def _is_input(item: Item) -> bool:
    return item["type"] == "function_call_output" or item.get("role") in (
        "user",
        "developer",
        "system",
    )


def _plain(item: Item) -> str:
    """What an item says: its text, its tool output, else its JSON."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    output = item.get("output")
    return output if isinstance(output, str) else orjson.dumps(item).decode()


def reached(line: str, body: Item) -> tuple[bool, bool]:
    """(the fact's turn reached the upstream outside the summary, its line reached at all).

    The summary is the message that starts with its header (a recall block may
    quote an earlier one, and still counts as the turn).
    """
    texts = [_plain(i) for i in body.get("input") or []]
    turn = any(line in t for t in texts if not t.startswith(SUMMARY_HEADER))
    return turn, any(line in t for t in texts)


def replay(session: Session, proxy_url: str, upstream: Upstream, every: int | None) -> Outcome:
    outcome = Outcome(sessions=1)
    base = {
        "model": "gpt-4o",
        "store": False,
        "stream": False,
        "tools": session.tools,
        "prompt_cache_key": session.name,
    }
    headers = {"session-id": session.name, "Authorization": "Bearer sk-bench"}
    history = list(session.items[: session.lead])
    folded: set[int] = set()
    held: list[int] = []  # the session item index of each history item after the lead
    with httpx.Client(base_url=proxy_url, headers=headers, timeout=60) as client:
        done = session.lead
        for end_in, end_out in exchanges(session.items):
            if end_in <= done:
                continue
            history += session.items[done:end_in]
            held += range(done, end_in)
            kept = history[session.lead :]
            if every is not None and sum(COUNTER.count(i) for i in kept) > every:
                answer = client.post("/v1/responses", json={**base, "input": [*history, TRIGGER]})
                answer.raise_for_status()
                (compaction,) = answer.json()["output"]
                history = [*history[: session.lead], compaction]
                folded.update(held)
                held = []
                outcome.compactions += 1
            upstream.script.append(session.items[end_in:end_out])
            client.post("/v1/responses", json={**base, "input": history}).raise_for_status()
            history += session.items[end_in:end_out]
            held += range(end_in, end_out)
            done = end_out
        for fact in session.facts:
            if fact.item not in folded:
                continue
            question = text_item("user", fact.question)
            asked = client.post("/v1/responses", json={**base, "input": [*history, question]})
            asked.raise_for_status()
            sent = upstream.received[-1]
            turn, anywhere = reached(fact.line, sent)
            outcome.facts.append((session.name, fact.question, turn, anywhere))
    return outcome


# -- the table ------------------------------------------------------------------------


def route(recall: int | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    policy: dict[str, Any] = {"strategy": "trim", "max_tokens": 1_000_000}
    if recall is not None:
        policy["recall"] = {"max_tokens": recall}
    routes = [
        {
            "match": {"path": "/v1/responses"},
            "upstream": "default",
            "policy": "agent",
            "compaction": "proxy",
            "compaction_summarizer": {"model": "ctxproxy/extractive"},
        }
    ]
    return routes, {"agent": policy}


def run_row(
    sessions: list[Session], every: int | None, recall: int | None
) -> tuple[Outcome, Upstream]:
    loop = LoopThread()
    fake = Upstream()
    upstream = AiohttpServer(loop, fake.app())
    total = Outcome(sessions=0)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            routes, policies = route(recall)
            config = make_config(upstream.url, Path(tmp), routes=routes, policies=policies)
            proxy = ProxyServer(loop, config)
            try:
                for session in sessions:
                    o = replay(session, proxy.url, fake, every)
                    total.sessions += 1
                    total.compactions += o.compactions
                    total.facts += o.facts
            finally:
                proxy.stop()
    finally:
        upstream.stop()
        loop.stop()
    return total, fake


def share(part: int, whole: int) -> str:
    return f"{100 * part / whole:5.1f}%" if whole else "    -"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


def table(
    name: str, sessions: list[Session], every: int, budgets: list[int], each_fact: bool
) -> bool:
    """The rows for one set of sessions; whether the target is met at the first budget."""
    rows: list[tuple[str, int | None, int | None]] = [
        ("no compaction", None, None),
        (f"compaction every {every}, summary alone", every, None),
    ]
    rows += [(f"compaction every {every} + recall {r}", every, r) for r in budgets]
    print(f"\n== {name}: {len(sessions)} sessions, {sum(len(s.facts) for s in sessions)} facts")
    header = (
        f"{'':44} {'compactions':>11} {'tokens fwd':>11} {'cached':>7} {'asked':>6} "
        f"{'turn reached':>12} {'answer reached':>14} {'foreign':>7}"
    )
    print(header)
    print("-" * len(header))
    outcomes = []
    for label, n, r in rows:
        o, fake = run_row(sessions, n, r)
        outcomes.append(o)
        print(
            f"{label:44} {o.compactions:11} {fake.tokens:11,} {share(fake.cached, fake.tokens):>7} "
            f"{o.asked:6} {share(o.turn_reached, o.asked):>12} "
            f"{share(o.answer_reached, o.asked):>14} {fake.foreign:7}"
        )
    target = outcomes[2]
    met = target.asked > 0 and target.turn_reached >= 0.9 * target.asked
    verdict = "met" if met else "NOT met"
    print(f"target: turn reached >= 90% with recall {budgets[0]}: {verdict}")
    if each_fact:
        alone, recalled = outcomes[1].facts, target.facts
        print(f"\n{'fact asked after its compaction':52} {'summary alone':>22} {'+ recall':>22}")
        print(f"{'':52} {'turn':>11} {'answer':>10} {'turn':>11} {'answer':>10}")
        for a, b in zip(alone, recalled, strict=True):
            print(
                f"{a[0] + ': ' + a[1]:52.52} {yes(a[2]):>11} {yes(a[3]):>10} "
                f"{yes(b[2]):>11} {yes(b[3]):>10}"
            )
    return met


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1500, help="compact past this many tokens")
    parser.add_argument(
        "--recall",
        type=int,
        nargs="+",
        default=[1000, 500, 2000],
        help="recall budgets, one row each; the target is checked at the first",
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--limit", type=int, default=100, help="tau conversations to replay")
    parser.add_argument("--facts", action="store_true", help="list tau's facts one by one too")
    args = parser.parse_args(argv)
    configure_logging("warning")  # no request_completed line per replayed request
    started = time.perf_counter()
    ok = True
    tau = args.data / "tau-airline-dev.json"
    if tau.exists():
        sessions = tau_sessions(tau, args.limit)
        ok &= table("tau-airline-dev", sessions, args.every, args.recall, args.facts)
    else:
        print(f"tau skipped: {tau} is not there (--data names the folder)")
    ok &= table(
        "codex (recorded)",
        [codex_session(ROOT / "tests/data/codex-session.json")],
        args.every,
        args.recall,
        True,
    )
    print(f"\n{time.perf_counter() - started:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
