"""Proxy overhead: direct vs a minimal aiohttp pass-through vs ctxproxy, side by side.

All run on loopback against one fast fake upstream, each server in its own
process; the load generator sends the same 20-message, ~4k-token body at
concurrency 1 and 16, in interleaved rounds so drift hits all alike. The
ctxproxy scenarios (one server, a route per policy chosen by an ``X-Bench``
header; logging at ``info``, the shipped default, to /dev/null):

- ``pass``: the passthrough policy without a session (nothing stored);
- ``pass+s``, ``trim+s``, ``balanced+s``: with a session (each exchange
  stored, the history resent every time): passthrough, trim ``{max_tokens:
  3000, low_water: 0.7}``, the ``balanced`` mode;
- ``commit+s``: ``pass+s`` on a second server that commits every stored
  exchange before the last byte reaches the client, as ``history: server``
  routes and ``/v1/responses`` do (client-held history writes after the
  answer): the pair ``pass+s`` / ``commit+s`` is that commit's latency cost;
- ``trim+s@warn``: ``trim+s`` on a third server logging at ``warning``: what
  the ``request_completed`` line costs;
- ``pg+s``: ``pass+s`` on the PostgreSQL store with Redis coordination (a
  fresh schema and key prefix, removed afterwards; ``--no-postgres`` leaves
  it out).

Prints req/s, p50, p99 and the server's CPU time per request (the robust
number on a shared machine) per scenario, and the ratios issue 16 sets
targets for: c=16 throughput / the minimal pass-through (``pass`` >= 0.90,
``trim+s`` >= 0.80, ``balanced+s`` >= 0.70), the p50 ``trim+s`` adds at c=1
over it (<= 0.3 ms), and (``sse``, also with ``--only sse``) the time to the
first SSE event of a streamed answer at c=1 through ``direct``, ``minimal``
(which relays the stream chunk by chunk), ``pass`` and ``trim+s`` (with
``--baseline``, the other checkout's two as well), in rounds of their own,
the p50 ``trim+s`` adds over ``minimal`` (<= 0.3 ms).

    python bench/overhead.py [--rounds 3] [--requests 400] [--concurrency 1 16]
        [--only NAME ...] [--baseline CHECKOUT] [--postgres URL] [--redis URL]
        [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]

UPSTREAM = r"""
import sys, orjson
from aiohttp import web
BODY = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok", "refusal": None},
    "logprobs": None, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 4000, "completion_tokens": 1, "total_tokens": 4001}})
def chunk(delta, finish=None):
    return b"data: " + orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk",
        "created": 1, "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}) + b"\n\n"
EVENTS = [chunk({"role": "assistant", "content": ""}), chunk({"content": "ok"}), chunk({}, "stop"),
    b"data: [DONE]\n\n"]
async def chat(request):
    raw = await request.read()
    if not orjson.loads(raw).get("stream"):
        return web.Response(body=BODY, content_type="application/json")
    # A stream: the first event at once, the rest after (the first chunk's latency is measured).
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in EVENTS:
        await response.write(event)
    await response.write_eof()
    return response
SEQ = [0]
async def responses(request):
    await request.read()
    SEQ[0] += 1  # a new id for every answer, as an upstream gives
    n = SEQ[0]
    return web.Response(content_type="application/json", body=orjson.dumps({
        "id": f"resp_{n}", "object": "response", "created_at": 1, "status": "completed",
        "model": "gpt-4o", "output": [{"type": "message", "id": f"msg_{n}", "status": "completed",
        "role": "assistant", "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
        "usage": {"input_tokens": 4000, "output_tokens": 1, "total_tokens": 4001}}))
app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post("/v1/chat/completions", chat)
app.router.add_post("/v1/responses", responses)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""

# The least a pass-through can do: read the body, forward it on a pooled client, relay the answer.
PASSTHROUGH = r"""
import sys
import aiohttp
from aiohttp import web
TARGET = sys.argv[2]
async def on_startup(app):
    app["client"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))
async def on_cleanup(app):
    await app["client"].close()
async def chat(request):
    body = await request.read()
    async with app["client"].post(TARGET, data=body,
            headers={"Content-Type": "application/json",
                     "Authorization": request.headers.get("Authorization", "")}) as r:
        if r.content_type == "text/event-stream":  # relayed chunk by chunk
            response = web.StreamResponse(status=r.status,
                headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            async for data in r.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response
        data = await r.read()
        return web.Response(body=data, status=r.status, content_type="application/json")
app = web.Application(client_max_size=64 * 1024 * 1024)
app.on_startup.append(on_startup)
app.on_cleanup.append(on_cleanup)
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_body(stream: bool = False) -> bytes:
    # 20 messages, about 4k tokens in all (English text is ~4 characters a token).
    sentence = "The quick brown fox jumps over the lazy dog while the proxy keeps count. "
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 10}]
    for i in range(19):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"Turn {i}. " + sentence * 11})
    body: dict[str, object] = {"model": "gpt-4o", "messages": messages, "temperature": 0}
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


async def wait_ready(url: str) -> None:
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.post(url, data=b"{}") as r:
                    await r.read()
                    return
            except aiohttp.ClientError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)


async def run_load(
    url: str, body: bytes, concurrency: int, total: int, headers: dict[str, str]
) -> tuple[float, list[float]]:
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as s:
        remaining = total

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                t0 = time.perf_counter()
                async with s.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url}: HTTP {r.status}")
                latencies.append((time.perf_counter() - t0) * 1000)

        # Warm the connections first.
        for _ in range(concurrency):
            async with s.post(url, data=body, headers=headers) as r:
                await r.read()
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return total / elapsed, latencies


async def first_chunks(url: str, body: bytes, total: int, headers: dict[str, str]) -> list[float]:
    """At concurrency 1, each streamed request's time to its first SSE event (ms)."""
    out: list[float] = []
    async with aiohttp.ClientSession() as s:
        for n in range(total + 1):
            t0 = time.perf_counter()
            async with s.post(url, data=body, headers=headers) as r:
                first = await r.content.readuntil(b"\n\n")
                elapsed = (time.perf_counter() - t0) * 1000
                await r.read()
                if r.status != 200 or not first.startswith(b"data: "):
                    raise RuntimeError(f"{url}: HTTP {r.status}, {first[:80]!r}")
            if n:  # the first warms the connection
                out.append(elapsed)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a server process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


TRIM = {"strategy": "trim", "max_tokens": 3000, "low_water": 0.7}


def proxy_config(
    path: Path, up_port: int, store: dict[str, object], level: str = "info", **extra: object
) -> Path:
    def route(bench: str | None, policy: str) -> dict[str, object]:
        match: dict[str, object] = {"path": "/v1/chat/completions"}
        if bench is not None:
            match["headers"] = {"X-Bench": bench}
        return {"match": match, "upstream": "fast", "policy": policy}

    path.write_text(
        json.dumps(
            {
                "store": store,
                "logging": {"level": level, "format": "json"},
                "upstreams": {"fast": {"base_url": f"http://127.0.0.1:{up_port}/v1"}},
                "policies": {"trim3000": TRIM},
                "routes": [
                    route("trim", "trim3000"),
                    route("balanced", "balanced"),
                    route(None, "passthrough"),
                ],
                **extra,
            }
        )
    )
    return path


# ctxproxy, committing every stored exchange before the last byte (bench only):
# what ``history: server`` routes do, on the client-held route's identical work.
COMMIT_FIRST = r"""
import sys
from proxy.chat.pipeline import ChatExchange
ChatExchange._durable = lambda self: self.ref is not None
from proxy.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


async def drop_schema(url: str, schema: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def drop_keys(url: str, prefix: str) -> None:
    from redis.asyncio import Redis

    client = Redis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


def start_proxy(
    procs: list[subprocess.Popen[bytes]],
    env: dict[str, str],
    config: Path,
    port: int,
    code: str | None = None,
    repo: Path = REPO,
) -> int:
    """Start a ctxproxy server (``code``: a ``-c`` program instead of ``-m proxy``; ``repo``:
    the checkout it runs from); its pid."""
    start = ["-c", code] if code is not None else ["-m", "proxy"]
    cmd = [sys.executable, *start, "--config", str(config), "--port", str(port)]
    env = {**env, "PYTHONPATH": str(repo)}
    procs.append(subprocess.Popen(cmd, env=env, cwd=repo, stdout=subprocess.DEVNULL))
    return procs[-1].pid


async def main_async(args: argparse.Namespace) -> int:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "PYTHONPATH": str(REPO)}
    procs: list[subprocess.Popen[bytes]] = []
    tmp = tempfile.TemporaryDirectory()
    work = Path(tmp.name)
    schema = f"bench_{os.getpid()}"
    try:
        up_port, pass_port = free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], env=env))
        upstream_url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", PASSTHROUGH, str(pass_port), upstream_url], env=env
            )
        )
        servers: dict[str, tuple[str, int]] = {
            "direct": (upstream_url, procs[0].pid),
            "minimal": (f"http://127.0.0.1:{pass_port}/v1/chat/completions", procs[1].pid),
        }

        def proxy(
            name: str,
            level: str = "info",
            code: str | None = None,
            repo: Path = REPO,
            **store: object,
        ) -> None:
            port = free_port()
            store = store or {"path": str(work / f"{name}.db")}
            extra = store.pop("extra", {})
            assert isinstance(extra, dict)
            config = proxy_config(work / f"{name}.json", up_port, store, level, **extra)
            pid = start_proxy(procs, env, config, port, code, repo)
            servers[name] = (f"http://127.0.0.1:{port}/v1/chat/completions", pid)

        proxy("ctxproxy")
        proxy("commit", code=COMMIT_FIRST)
        proxy("quiet", level="warning")
        if not args.no_postgres:
            proxy(
                "pg",
                url=args.postgres,
                schema=schema,
                pool_size=10,
                extra={"coordination": {"redis_url": args.redis, "key_prefix": f"bench:{schema}"}},
            )
        # scenario -> (server, X-Bench route, session)
        scenarios: dict[str, tuple[str, str | None, bool]] = {
            "direct": ("direct", None, False),
            "minimal": ("minimal", None, False),
            "pass": ("ctxproxy", None, False),
            "pass+s": ("ctxproxy", None, True),
            "trim+s": ("ctxproxy", "trim", True),
            "balanced+s": ("ctxproxy", "balanced", True),
            "commit+s": ("commit", None, True),
            "trim+s@warn": ("quiet", "trim", True),
        }
        if not args.no_postgres:
            scenarios["pg+s"] = ("pg", None, True)
        if args.baseline is not None:
            # Another checkout (an earlier commit) beside this one, in the same rounds.
            proxy("baseline", repo=Path(args.baseline).resolve())
            for name in ("pass", "trim+s", "balanced+s"):
                _, bench, session = scenarios[name]
                scenarios[f"{name}@base"] = ("baseline", bench, session)
        if args.only:
            keep = {"minimal", *args.only}
            if "sse" in args.only:
                keep |= {"direct", "pass", "trim+s", "pass@base", "trim+s@base"}
            scenarios = {k: v for k, v in scenarios.items() if k in keep}
        for url, _ in servers.values():
            await wait_ready(url)
        body = make_body()

        def headers(name: str) -> dict[str, str]:
            _, bench, session = scenarios[name]
            h = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
            if bench is not None:
                h["X-Bench"] = bench
            if session:
                # One session per scenario, the same history resent every time.
                h["X-Session-Id"] = f"bench-{name}"
            return h

        results: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
        cpu: dict[tuple[str, int], list[float]] = {}
        # Warm every scenario first (connection pools, the tokenizer's one-time
        # load, SQLite caches, a summary), so the rounds measure the steady state.
        for name, (server, _, _) in scenarios.items():
            await run_load(servers[server][0], body, 4, 200, headers(name))
        for concurrency in args.concurrency:
            for rnd in range(args.rounds):
                for name, (server, _, _) in scenarios.items():
                    url, pid = servers[server]
                    before = cpu_seconds(pid)
                    rps, lat = await run_load(url, body, concurrency, args.requests, headers(name))
                    # Server CPU per request: robust to other load on the machine.
                    used = (cpu_seconds(pid) - before) / (args.requests + concurrency)
                    cpu.setdefault((name, concurrency), []).append(used * 1000)
                    entry = results.setdefault((name, concurrency), ([], []))
                    entry[0].append(rps)
                    entry[1].extend(lat)
                    print(
                        f"  round {rnd + 1} c={concurrency:<2} {name:<12} {rps:8.0f} req/s",
                        flush=True,
                    )
        # The first SSE event of a streamed answer, c=1, interleaved the same way.
        # (With --baseline, the other checkout's pass and trim+s too.)
        streamed = [
            n
            for n in ("direct", "minimal", "pass", "trim+s", "pass@base", "trim+s@base")
            if n in scenarios
        ]
        stream_body = make_body(stream=True)
        first: dict[str, list[float]] = {}
        if not args.only or "sse" in args.only:
            for _ in range(args.rounds):
                for name in streamed:
                    url = servers[scenarios[name][0]][0]
                    got = await first_chunks(url, stream_body, args.requests // 4, headers(name))
                    first.setdefault(name, []).extend(got)
        print()
        print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(
            f"{'scenario':<12} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'cpu ms/req':>11} {'÷ minimal':>10}"
        )

        def rps(name: str, c: int) -> float:
            return statistics.median(results[(name, c)][0])

        def ratio(name: str, c: int) -> float:
            # Per round, then the median: each round's pair ran back to back.
            pairs = zip(results[(name, c)][0], results[("minimal", c)][0], strict=True)
            return statistics.median(a / b for a, b in pairs)

        def p50(name: str, c: int) -> float:
            return pct(results[(name, c)][1], 0.5)

        for (name, concurrency), (rps_list, lat) in results.items():
            print(
                f"{name:<12} {concurrency:>4} {statistics.median(rps_list):9.0f} "
                f"{pct(lat, 0.5):8.3f} {pct(lat, 0.99):8.3f} "
                f"{statistics.median(cpu[(name, concurrency)]):11.3f} "
                f"{ratio(name, concurrency):10.2f}"
            )
        print()
        targets = {"pass": 0.90, "trim+s": 0.80, "balanced+s": 0.70}
        for name, target in targets.items():
            if (name, 16) in results:
                print(
                    f"throughput {name}/minimal at c=16: {ratio(name, 16):.2f} (target >= {target})"
                )
        if ("trim+s", 1) in results:
            added = p50("trim+s", 1) - p50("minimal", 1)
            print(f"p50 added by trim+s at c=1 over minimal: {added:+.3f} ms (target <= 0.3 ms)")
        if "minimal" in first:
            for name in streamed:
                if name in first and name != "minimal":
                    added = pct(first[name], 0.5) - pct(first["minimal"], 0.5)
                    print(
                        f"first SSE event, c=1, {name}: p50 {pct(first[name], 0.5):.3f} ms,"
                        f" {added:+.3f} ms over minimal"
                        + (" (target <= 0.3 ms)" if name == "trim+s" else "")
                    )
        if ("pass+s", 1) in results and ("commit+s", 1) in results:
            for c in args.concurrency:
                cost = p50("commit+s", c) - p50("pass+s", c)
                print(
                    f"commit before the last byte, c={c}: p50 {cost:+.3f} ms, throughput "
                    f"{rps('commit+s', c) / rps('pass+s', c):.2f}x of the write-after path"
                )
        for name in ("pass", "trim+s", "balanced+s"):
            for c in args.concurrency:
                if (f"{name}@base", c) in results:
                    now = statistics.median(cpu[(name, c)])
                    then = statistics.median(cpu[(f"{name}@base", c)])
                    print(
                        f"{name} c={c} vs the baseline checkout: CPU per request {now / then:.2f}x,"
                        f" throughput {ratio(name, c) / ratio(f'{name}@base', c):.2f}x"
                    )
        if ("trim+s", 16) in results and ("trim+s@warn", 16) in results:
            info_cpu = statistics.median(cpu[("trim+s", 16)])
            warn_cpu = statistics.median(cpu[("trim+s@warn", 16)])
            print(
                f"logging at info vs warning (trim+s, c=16): CPU {info_cpu / warn_cpu - 1:+.1%}"
                " per request (target <= 5%)"
            )
        return 0
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
        tmp.cleanup()
        if not args.no_postgres:
            await drop_schema(args.postgres, schema)
            await drop_keys(args.redis, f"bench:{schema}:")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--only", nargs="+", help="run only these scenarios (and minimal)")
    parser.add_argument(
        "--baseline", help="another checkout's path: its pass, trim+s, balanced+s run alongside"
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--no-postgres", action="store_true", help="leave out the PostgreSQL store's run"
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
