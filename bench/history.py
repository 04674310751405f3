"""Long histories: request CPU at 20 vs 2,000 messages, memory over many sessions, storage.

One fake upstream and one ctxproxy (SQLite, trim ``{max_tokens: 3000,
low_water: 0.7}``), each in its own process, on loopback. Messages are
about 200 tokens each (the 20-message, ~4k-token body of bench/overhead.py).

- **Warm request CPU**: the server's CPU time per request (from /proc), for
  sessions of 20 and of 2,000 messages, with the history held by the client
  (the whole list resent every time) and with ``history: server`` (the client
  sends one message), each with 10 and with 64 active sessions; and, with 10
  sessions, the Responses API continuing each turn's ``previous_response_id``
  (the proxy replays the stored chain; no target in issue 16). A pass over
  a scenario's sessions warms it (not measured), then the next passes are
  measured; scenarios are interleaved round by round so drift on a shared
  machine hits all alike. The ratios are what count.
- **RSS after the CPU rounds**: what holding all their sessions took (printed
  with them, no target).
- **Memory**: the RSS of a fresh proxy after 1,000 sessions of 20 turns each
  (client-held history), then after 5,000 (``--quick``: 200 and 1,000).
- **Storage**: the SQLite file's bytes per stored message against the
  message's JSON, split by table and index (``dbstat``), and the request row's
  size in a short and in a long session.

Prints one table beside the figures of issue 16 ("now") and the targets.

    python bench/history.py [--rounds 3] [--quick] [--no-memory] [--only cpu|memory|storage]
        [--cache 1GiB]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from overhead import UPSTREAM, cpu_seconds, free_port, wait_ready

REPO = Path(__file__).resolve().parents[1]
SENTENCE = "The quick brown fox jumps over the lazy dog while the proxy keeps count. "
HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}

# Issue 16's "now" column, for the same rows.
NOW = {
    "client": "19x",
    "server": "30x",
    "sessions": "128 vs 13 ms",
    "rss": "572 MB",
    "bytes": "1,843 B (2x)",
    "row": "grows with the session",
}


def text(i: int) -> str:
    return f"Turn {i}. " + SENTENCE * 11


def history(n: int) -> list[dict[str, Any]]:
    """A system message and ``n - 1`` alternating turns, about 200 tokens each."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. " * 10}
    ]
    for i in range(n - 1):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": text(i)})
    return out


def config(path: Path, up_port: int, db: Path, cache: str | None = None) -> Path:
    trim = {"strategy": "trim", "max_tokens": 3000, "low_water": 0.7}
    route = {"upstream": "fast", "policy": "trim"}
    path.write_text(
        json.dumps(
            {
                "store": {"path": str(db)},
                "logging": {"level": "warning"},
                "upstreams": {"fast": {"base_url": f"http://127.0.0.1:{up_port}/v1"}},
                "policies": {"trim": trim},
                **({"cache": {"max_bytes": cache}} if cache else {}),
                "routes": [
                    {
                        "match": {
                            "path": "/v1/chat/completions",
                            "headers": {"X-History": "server"},
                        },
                        "history": "server",
                        **route,
                    },
                    {"match": {"path": "/v1/chat/completions"}, **route},
                    {"match": {"path": "/v1/responses"}, **route},
                ],
            }
        )
    )
    return path


@dataclass
class Session:
    key: str
    server: bool
    # What the client holds (client-held history) or has sent so far.
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn: int = 0
    # The Responses API: each turn continues the last answer's id.
    responses: bool = False
    previous: str | None = None


class Proxy:
    """A ctxproxy process with its own database."""

    def __init__(self, tmp: Path, name: str, up_port: int, cache: str | None = None) -> None:
        self.db = tmp / f"{name}.db"
        self.port = free_port()
        cfg = config(tmp / f"{name}.json", up_port, self.db, cache)
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--config", str(cfg), "--port", str(self.port)],
            env=env,
            cwd=REPO,
        )
        self.url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        self.responses_url = f"http://127.0.0.1:{self.port}/v1/responses"

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


async def send(http: aiohttp.ClientSession, url: str, s: Session, *, seed: int = 0) -> None:
    """One turn of ``s``: a new user message (``seed``: the first ``seed`` messages too)."""
    new = history(seed) if seed else []
    new.append({"role": "user", "content": f"{s.key} asks " + text(s.turn)})
    s.turn += 1
    if s.responses:
        body = {"model": "gpt-4o", "input": new, "previous_response_id": s.previous}
        data = json.dumps(body).encode()
        headers = {**HEADERS, "X-Session-Id": s.key}
        async with http.post(
            url.replace("/chat/completions", "/responses"), data=data, headers=headers
        ) as r:
            answer = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {answer[:300]!r}")
        s.previous = json.loads(answer)["id"]
        return
    if s.server:
        body, headers = new, {**HEADERS, "X-Session-Id": s.key, "X-History": "server"}
    else:
        s.messages.extend(new)
        body, headers = s.messages, {**HEADERS, "X-Session-Id": s.key}
    data = json.dumps({"model": "gpt-4o", "messages": body}).encode()
    async with http.post(url, data=data, headers=headers) as r:
        answer = await r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {answer[:300]!r}")
    if not s.server:
        s.messages.append(json.loads(answer)["choices"][0]["message"])


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


# -- warm request CPU ---------------------------------------------------------


async def cpu_phase(
    proxy: Proxy, rounds: int, sizes: Sequence[int], counts: Sequence[int]
) -> dict[tuple[str, int, int], list[float]]:
    scenarios: dict[tuple[str, int, int], list[Session]] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for mode in ("client", "server", "responses"):
            for n in sizes:
                for k in counts if mode != "responses" else counts[:1]:
                    sessions = [
                        Session(
                            f"{mode}-{n}-{k}-{i}", mode == "server", responses=mode == "responses"
                        )
                        for i in range(k)
                    ]
                    for s in sessions:
                        await send(http, proxy.url, s, seed=n - 1)
                    scenarios[(mode, n, k)] = sessions
        print(f"  seeded {sum(map(len, scenarios.values()))} sessions (load {load()})", flush=True)
        out: dict[tuple[str, int, int], list[float]] = {}
        for rnd in range(rounds):
            for name, sessions in scenarios.items():
                for s in sessions:  # warm: every session of the scenario just seen
                    await send(http, proxy.url, s)
                passes = max(1, 64 // len(sessions))
                before = proxy.cpu()
                for _ in range(passes):
                    for s in sessions:
                        await send(http, proxy.url, s)
                ms = (proxy.cpu() - before) * 1000 / (passes * len(sessions))
                out.setdefault(name, []).append(ms)
                print(f"  round {rnd + 1} {name}: {ms:.2f} ms/request", flush=True)
    return out


# -- memory ---------------------------------------------------------------------


async def memory_phase(proxy: Proxy, steps: Sequence[int], turns: int) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    done = 0
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=16)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        for total in steps:

            async def worker(todo: Iterator[int]) -> None:
                for i in todo:
                    s = Session(f"mem-{i}", server=False, messages=history(1))
                    for _ in range(turns):
                        await send(http, proxy.url, s)

            started = time.monotonic()
            todo = iter(range(done, total))
            await asyncio.gather(*(worker(todo) for _ in range(16)))
            done = total
            await asyncio.sleep(1.0)  # the last writes commit
            out.append((total, proxy.rss_mb()))
            print(
                f"  {total} sessions x {turns} turns: RSS {out[-1][1]:.0f} MB"
                f" ({time.monotonic() - started:.0f} s, load {load()})",
                flush=True,
            )
    return out


# -- storage ----------------------------------------------------------------------


def storage(db: Path) -> dict[str, Any]:
    """Bytes per stored message by table and index, and request-row sizes."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        items, json_bytes = conn.execute(
            "SELECT count(*), sum(length(CAST(message_json AS BLOB))) FROM items"
        ).fetchone()
        by_name = dict(
            conn.execute(
                "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
            ).fetchall()
        )
        page = conn.execute("PRAGMA page_size").fetchone()[0]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        cols = [r[1] for r in conn.execute("PRAGMA table_info(requests)")]
        length = " + ".join(f"coalesce(length(CAST({c} AS BLOB)), 0)" for c in cols)
        rows = conn.execute(
            f"SELECT messages_before, {length} FROM requests WHERE messages_before > 0"
        ).fetchall()
    finally:
        conn.close()
    short = [size for n, size in rows if n <= 40]
    long = [size for n, size in rows if n >= 1000]
    return {
        "items": items,
        "json": json_bytes / max(items, 1),
        "file": page * pages / max(items, 1),
        "page_size": page,
        "by_name": {k: v / max(items, 1) for k, v in by_name.items()},
        "row_short": statistics.median(short) if short else 0.0,
        "row_long": statistics.median(long) if long else 0.0,
    }


# -- the table ----------------------------------------------------------------------


def print_by_name(stored: dict[str, Any]) -> None:
    print(
        "bytes per stored message by table/index: "
        + ", ".join(f"{k} {v:.0f}" for k, v in stored["by_name"].items() if v >= 1)
    )


def print_storage(stored: dict[str, Any]) -> None:
    """``--only storage``: the storage rows alone (the sessions seeded, no rounds run)."""
    print()
    print_by_name(stored)
    print(
        f"SQLite bytes per stored message: {stored['file']:.0f} B"
        f" ({stored['file'] / stored['json']:.2f}x of {stored['json']:.0f} B of JSON,"
        f" {stored['items']} messages, {stored['page_size']} B pages)"
    )
    print(
        f"request row, short vs long session: {stored['row_short']:.0f} B vs {stored['row_long']:.0f} B"
    )


def table(
    cpu: dict[tuple[str, int, int], list[float]],
    sizes: Sequence[int],
    counts: Sequence[int],
    memory: list[tuple[int, float]],
    stored: dict[str, Any],
) -> None:
    def med(mode: str, n: int, k: int) -> float:
        return statistics.median(cpu[(mode, n, k)])

    lo, hi = sizes[0], sizes[-1]
    few, many = counts[0], counts[-1]
    rows: list[tuple[str, str, str, str]] = []
    print()
    print(f"{'history':<8} {'messages':>8} {'sessions':>8} {'cpu ms/req':>11}")
    for (mode, n, k), values in cpu.items():
        print(f"{mode:<8} {n:>8} {k:>8} {statistics.median(values):11.2f}")
    for mode, target in (("client", 5.0), ("server", 2.0)):
        ratio = med(mode, hi, few) / med(mode, lo, few)
        rows.append(
            (
                f"warm CPU {hi} / {lo} messages, {mode}-held ({few} sessions)",
                NOW[mode],
                f"{ratio:.1f}x ({med(mode, hi, few):.2f} / {med(mode, lo, few):.2f} ms)",
                f"<= {target:.0f}x",
            )
        )
    ratio = med("responses", hi, few) / med("responses", lo, few)
    rows.append(
        (
            f"warm CPU {hi} / {lo} items, responses (previous_response_id, {few} sessions)",
            "",
            f"{ratio:.1f}x ({med('responses', hi, few):.2f} / {med('responses', lo, few):.2f} ms)",
            "-",
        )
    )
    for mode in ("client", "server"):
        ratio = med(mode, hi, many) / med(mode, hi, few)
        rows.append(
            (
                f"warm CPU at {hi}, {many} vs {few} sessions, {mode}-held",
                NOW["sessions"] if mode == "client" else "",
                f"{ratio:.2f}x ({med(mode, hi, many):.2f} vs {med(mode, hi, few):.2f} ms)",
                "<= 1.3x",
            )
        )
    if memory:
        first, last = memory[0], memory[-1]
        rows.append(
            (
                f"RSS after {first[0]} sessions x 20 turns",
                NOW["rss"],
                f"{first[1]:.0f} MB",
                "<= 200 MB",
            )
        )
        rows.append(
            (
                f"RSS at {last[0]} sessions",
                "",
                f"{last[1]:.0f} MB ({(last[1] / first[1] - 1) * 100:+.0f}%)",
                "+-10%",
            )
        )
    rows.append(
        (
            "SQLite bytes per stored message (JSON)",
            NOW["bytes"],
            f"{stored['file']:.0f} B ({stored['file'] / stored['json']:.2f}x of {stored['json']:.0f})",
            "<= 1.3x",
        )
    )
    rows.append(
        (
            "request row, short vs long session",
            NOW["row"],
            f"{stored['row_short']:.0f} B vs {stored['row_long']:.0f} B",
            "the same",
        )
    )
    print()
    print_by_name(stored)
    print()
    width = max(len(r[0]) for r in rows)
    print(f"{'':<{width}}  {'now (issue 16)':<24} {'measured':<36} target")
    for name, now, measured, target in rows:
        print(f"{name:<{width}}  {now:<24} {measured:<36} {target}")
    print(f"\nload average at the end: {load()} (2 cores, shared)")


async def main_async(args: argparse.Namespace) -> int:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    sizes, counts = (20, 2000), (10, 64)
    steps = (200, 1000) if args.quick else (1000, 5000)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        up_port = free_port()
        upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], env=env)
        proxies: list[Proxy] = []
        try:
            cpu: dict[tuple[str, int, int], list[float]] = {}
            stored: dict[str, Any] = {}
            if args.only != "memory":
                cpu_proxy = Proxy(tmp, "cpu", up_port, args.cache)
                proxies.append(cpu_proxy)
                await wait_ready(cpu_proxy.url)
                print(f"warm request CPU (load {load()})", flush=True)
                rounds = 0 if args.only == "storage" else args.rounds
                cpu = await cpu_phase(cpu_proxy, rounds, sizes, counts)
                # What holding every scenario's sessions took (148 of 2,000 messages).
                print(f"  RSS after the warm-CPU rounds: {cpu_proxy.rss_mb():.0f} MB", flush=True)
                cpu_proxy.stop()
                stored = storage(cpu_proxy.db)
                if args.only == "storage":
                    print_storage(stored)
                    return 0
            memory: list[tuple[int, float]] = []
            if not args.no_memory and args.only != "cpu":
                mem_proxy = Proxy(tmp, "memory", up_port, args.cache)
                proxies.append(mem_proxy)
                await wait_ready(mem_proxy.url)
                print(f"memory (load {load()})", flush=True)
                memory = await memory_phase(mem_proxy, steps, 20)
                mem_proxy.stop()
            if cpu:
                table(cpu, sizes, counts, memory, stored)
            else:
                for total, rss in memory:
                    print(f"RSS after {total} sessions x 20 turns: {rss:.0f} MB")
        finally:
            for p in proxies:
                if p.proc.poll() is None:
                    p.stop()
            upstream.terminate()
            upstream.wait(10)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 round, 200 and 1,000 sessions")
    parser.add_argument("--no-memory", action="store_true", help="leave out the RSS phase")
    parser.add_argument(
        "--only",
        choices=("cpu", "memory", "storage"),
        help="one phase: the warm-request CPU and storage, the RSS, or the storage alone"
        " (the CPU phase's sessions seeded, no rounds)",
    )
    parser.add_argument("--cache", help="the proxy's cache.max_bytes (default: its own, 256MiB)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
