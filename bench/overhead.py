"""Proxy overhead: direct vs a minimal aiohttp pass-through vs ctxproxy, side by side.

All run on loopback against one fast fake upstream, each server in its own
process; the load generator sends the same 20-message, ~4k-token body at
concurrency 1 and 16, in interleaved rounds so drift hits all alike.
ctxproxy runs twice: on SQLite (the default) and, as ``ctxproxy-pg``, on the
PostgreSQL store with Redis coordination (a fresh schema and key prefix,
removed afterwards; ``--no-postgres`` leaves it out).
Prints req/s, p50, p99 and the server's CPU time per request (the robust
number on a shared machine) per target, and the ratios the issue sets targets
for: ctxproxy keeps >= 60% of the pass-through's throughput at concurrency 16
and adds < 1 ms p50 at concurrency 1. Requests carry a session id (each
exchange is stored, the history resent every time) unless --no-session.

    python bench/overhead.py [--rounds 3] [--requests 400] [--no-session]
        [--postgres URL] [--redis URL] [--no-postgres]
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
async def chat(request):
    await request.read()
    return web.Response(body=BODY, content_type="application/json")
app = web.Application(client_max_size=64 * 1024 * 1024)
app.router.add_post("/v1/chat/completions", chat)
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


def make_body() -> bytes:
    # 20 messages, about 4k tokens in all (English text is ~4 characters a token).
    sentence = "The quick brown fox jumps over the lazy dog while the proxy keeps count. "
    messages = [{"role": "system", "content": "You are a helpful assistant. " * 10}]
    for i in range(19):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"Turn {i}. " + sentence * 11})
    return json.dumps({"model": "gpt-4o", "messages": messages, "temperature": 0}).encode()


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a server process has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proxy_config(path: Path, up_port: int, store: dict[str, object], **extra: object) -> Path:
    path.write_text(
        json.dumps(
            {
                "store": store,
                "logging": {"level": "warning"},
                "upstreams": {"fast": {"base_url": f"http://127.0.0.1:{up_port}/v1"}},
                "routes": [{"match": {"path": "/v1/chat/completions"}, "upstream": "fast"}],
                **extra,
            }
        )
    )
    return path


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


async def main_async(args: argparse.Namespace) -> int:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    procs: list[subprocess.Popen[bytes]] = []
    tmp = tempfile.TemporaryDirectory()
    schema = f"bench_{os.getpid()}"
    try:
        up_port, pass_port, proxy_port = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], env=env))
        upstream_url = f"http://127.0.0.1:{up_port}/v1/chat/completions"
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", PASSTHROUGH, str(pass_port), upstream_url], env=env
            )
        )
        config = proxy_config(
            Path(tmp.name) / "config.yaml", up_port, {"path": str(Path(tmp.name) / "bench.db")}
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "proxy", "--config", str(config), "--port", str(proxy_port)],
                env=env,
                cwd=REPO,
            )
        )
        targets = {
            "direct": upstream_url,
            "minimal": f"http://127.0.0.1:{pass_port}/v1/chat/completions",
            "ctxproxy": f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        }
        pids = {"direct": procs[0].pid, "minimal": procs[1].pid, "ctxproxy": procs[2].pid}
        if not args.no_postgres:
            pg_port = free_port()
            pg_config = proxy_config(
                Path(tmp.name) / "pg.yaml",
                up_port,
                {"url": args.postgres, "schema": schema, "pool_size": 10},
                coordination={"redis_url": args.redis, "key_prefix": f"bench:{schema}"},
            )
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "proxy",
                        "--config",
                        str(pg_config),
                        "--port",
                        str(pg_port),
                    ],
                    env=env,
                    cwd=REPO,
                )
            )
            targets["ctxproxy-pg"] = f"http://127.0.0.1:{pg_port}/v1/chat/completions"
            pids["ctxproxy-pg"] = procs[-1].pid
        for url in targets.values():
            await wait_ready(url)
        body = make_body()
        headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
        if not args.no_session:
            # One session, the same history resent every time: each request is stored.
            headers["X-Session-Id"] = "bench"
        results: dict[tuple[str, int], tuple[list[float], list[float]]] = {}
        cpu: dict[tuple[str, int], list[float]] = {}
        # Warm every target first (connection pools, the tokenizer's one-time
        # load, SQLite caches), so the rounds measure the steady state.
        for url in targets.values():
            await run_load(url, body, 4, 200, headers)
        for concurrency in args.concurrency:
            for rnd in range(args.rounds):
                for name, url in targets.items():
                    before = cpu_seconds(pids[name])
                    rps, lat = await run_load(url, body, concurrency, args.requests, headers)
                    # Server CPU per request: robust to other load on the machine.
                    used = (cpu_seconds(pids[name]) - before) / (args.requests + concurrency)
                    cpu.setdefault((name, concurrency), []).append(used * 1000)
                    entry = results.setdefault((name, concurrency), ([], []))
                    entry[0].append(rps)
                    entry[1].extend(lat)
                    print(
                        f"  round {rnd + 1} c={concurrency:<2} {name:<11} {rps:8.0f} req/s",
                        flush=True,
                    )
        print()
        print(
            f"{'target':<12} {'conc':>4} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/req':>11}"
        )
        for (name, concurrency), (rps_list, lat) in results.items():
            print(
                f"{name:<12} {concurrency:>4} {statistics.median(rps_list):9.0f} "
                f"{pct(lat, 0.5):8.3f} {pct(lat, 0.99):8.3f} "
                f"{statistics.median(cpu[(name, concurrency)]):11.3f}"
            )

        def rps(name: str, c: int) -> float:
            return statistics.median(results[(name, c)][0])

        def p50(name: str, c: int) -> float:
            return pct(results[(name, c)][1], 0.5)

        for proxy in ("ctxproxy", "ctxproxy-pg"):
            if proxy not in targets:
                continue
            print()
            if (proxy, 16) in results:
                ratio16 = rps(proxy, 16) / rps("minimal", 16)
                print(f"throughput {proxy}/minimal at c=16: {ratio16:.2f} (target >= 0.60)")
                print(
                    f"throughput {proxy}/direct  at c=16: {rps(proxy, 16) / rps('direct', 16):.2f}"
                )
            if (proxy, 1) in results:
                added_direct = p50(proxy, 1) - p50("direct", 1)
                added_minimal = p50(proxy, 1) - p50("minimal", 1)
                print(
                    f"p50 added by {proxy} at c=1 vs direct:  {added_direct:.3f} ms (target < 1 ms)"
                )
                print(f"p50 added by {proxy} at c=1 vs minimal: {added_minimal:.3f} ms")
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
    parser.add_argument(
        "--no-session", action="store_true", help="send no session id (nothing is stored)"
    )
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--no-postgres", action="store_true", help="leave out the PostgreSQL store's run"
    )
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
