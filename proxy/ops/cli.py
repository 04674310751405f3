"""`python -m proxy sessions list|show|delete|export|purge` and `python -m proxy replay`.

``sessions`` works on the same store the proxy writes (read while it runs:
SQLite in WAL mode lets readers and one writer share the file) and shows what
the admin API shows (:mod:`proxy.admin_views`). ``replay`` runs a
conversation through a configured policy offline, with the proxy's own
rewriter, and prints each turn (:mod:`proxy.replay_cli`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from proxy.config.loader import describe, read_yaml, store_section
from proxy.errors import ConfigError
from proxy.ops.admin_views import (
    export_lines,
    ndjson,
    request_context,
    session_detail,
    session_list,
)
from proxy.ops.context_cli import print_context
from proxy.ops.replay_cli import run_replay
from proxy.store.backends import StoreSpec, build_store
from proxy.store.base import SessionRef, Store
from proxy.store.sqlite import StoreUnavailable


def _store_options(p: argparse.ArgumentParser) -> None:
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="the proxy's YAML config (its store section is used)")
    where.add_argument("--db", help="path to the SQLite file")


def add_commands(sub: Any) -> None:
    """``sessions`` and ``replay``, added to the command line's subcommands."""
    sessions = sub.add_parser("sessions", help="list, show, delete or export stored sessions")
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="sessions, most recent activity first")
    _store_options(ls)
    ls.add_argument("--tenant", help="only this tenant's sessions")
    ls.add_argument("--session", help="only sessions whose id contains this, in any tenant")
    ls.add_argument("--limit", type=int, default=50)
    ls.add_argument("--offset", type=int, default=0)
    ls.add_argument("--json", action="store_true", help="print the admin API's JSON")
    for name, help_text in (
        ("show", "a session's history, summaries and requests"),
        ("delete", "delete a session and everything that belongs to it"),
        ("export", "a session as JSON Lines"),
    ):
        p = actions.add_parser(name, help=help_text)
        p.add_argument(
            "ids",
            nargs="+",
            metavar="[TENANT] SESSION",
            help="the session id, after its tenant (as `sessions list` shows it) "
            "when the id is in use under more than one",
        )
        _store_options(p)
        if name == "show":
            p.add_argument("--json", action="store_true", help="print the admin API's JSON")
        if name == "export":
            p.add_argument("-o", "--output", help="file to write (default: stdout)")
    pg = actions.add_parser(
        "purge", help="remove what deletions left on disk (docs/operations/deletion.md)"
    )
    _store_options(pg)
    rq = actions.add_parser("request", help="what one request forwarded, item by item")
    rq.add_argument("request_id", help="request id (X-Ctxproxy-Request-Id)")
    _store_options(rq)
    rq.add_argument("--json", action="store_true", help="print the admin API's JSON")
    rp = sub.add_parser("replay", help="replay a conversation through a policy, offline")
    rp.add_argument("file", help="chat JSON list, tau-bench or LoCoMo JSON, or a JSONL export")
    rp.add_argument("--config", required=True, help="the YAML config that defines the policy")
    rp.add_argument("--policy", required=True, help="a key of the config's policies")
    rp.add_argument("--model", default="gpt-4o", help="model to count tokens for (gpt-4o)")
    rp.add_argument("--index", type=int, help="replay only the N-th conversation of the file")
    rp.add_argument("--jsonl", action="store_true", help="one JSON object per turn")
    rp.add_argument("--no-progress", action="store_true", help="no progress on stderr")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ctxproxy")
    add_commands(parser.add_subparsers(dest="command", required=True))
    return parser


# -- sessions -------------------------------------------------------------------


def _store_spec(config_path: str, err: TextIO) -> StoreSpec | None:
    """The config's ``store`` section (SQLite path or shared store URL), read alone.

    The store is all these commands need; resolving the whole config would
    demand every ``os.environ/`` secret (upstream and admin keys) in the
    operator's shell.
    """
    try:
        data, _ = read_yaml(config_path)
        store = store_section(data, config_path)
    except ConfigError as exc:
        print(describe(exc, config_path), file=err)
        return None
    return StoreSpec(
        path=store.path,
        url=store.url,
        pool_size=2,
        schema=store.schema,
        key_prefix=store.key_prefix,
    )


async def _with_store(
    spec: StoreSpec, work: Callable[[Store], Awaitable[int]], *, read_only: bool
) -> int:
    if spec.url is not None:  # a shared store's server: nothing to create by mistake
        store = build_store(spec)
        await store.open()
    else:
        from proxy.store.sqlite import SqliteStore

        sqlite = SqliteStore(spec.path)
        if read_only:
            await sqlite.open_read_only()
        elif not Path(spec.path).is_file():
            # Not even `delete` makes a database: a typo in --db is an error, not a new file.
            raise StoreUnavailable(f"no database at {spec.path!r}")
        else:
            await sqlite.open()
        store = sqlite
    try:
        return await work(store)
    finally:
        await store.close()


async def _resolve(store: Store, ids: list[str], err: TextIO) -> SessionRef | None:
    """``[TENANT] SESSION`` as a session: the tenant may be left out when only one has it."""
    if len(ids) > 2:
        print("name a session as SESSION or TENANT SESSION", file=err)
        return None
    if len(ids) == 2:
        return SessionRef(ids[0], ids[1])
    key = ids[0]
    tenants: list[str] = []
    offset = 0
    while True:  # every session, a page at a time: an operator's command, not the request path
        page = await store.list_sessions(tenant=None, limit=1000, offset=offset)
        tenants += [info.tenant for info in page if info.key == key]
        if len(page) < 1000:
            break
        offset += len(page)
    if not tenants:
        print(f"no session {key!r} under any tenant", file=err)
        return None
    if len(tenants) > 1:
        print(
            f"session {key!r} exists under {len(tenants)} tenants: {', '.join(tenants)}; "
            f"name one: sessions show TENANT {key}",
            file=err,
        )
        return None
    return SessionRef(tenants[0], key)


def _preview(message: dict[str, Any], width: int = 70) -> str:
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = " ".join(p.get("text", f"[{p.get('type')}]") for p in content if isinstance(p, dict))
    else:
        calls = message.get("tool_calls") or []
        names = [(c.get("function") or {}).get("name", "?") for c in calls if isinstance(c, dict)]
        text = f"[calls {', '.join(names)}]" if names else ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def print_list(page: dict[str, Any], out: TextIO) -> None:
    print(
        f"{'last activity':29} {'tenant':24} {'session':24} {'turns':>5} {'msgs':>5} "
        f"{'reqs':>5} {'tokens':>7}",
        file=out,
    )
    for s in page["data"]:
        print(
            f"{s['last_activity']:29} {s['tenant']:24} {s['key']:24} {s['turns']:5d} "
            f"{s['messages']:5d} {s['request_count']:5d} {s['stored_tokens']:7d}",
            file=out,
        )
    more = f"; more after offset {page['offset'] + page['limit']}" if page["has_more"] else ""
    print(f"({len(page['data'])} sessions from offset {page['offset']}{more})", file=out)


def print_session(d: dict[str, Any], out: TextIO) -> None:
    print(f"session {d['key']!r} of tenant {d['tenant']}", file=out)
    print(
        f"created {d['created_at']}, last activity {d['last_activity']}: {d['turns']} turns, "
        f"{d['messages']} messages, {d['request_count']} requests, "
        f"{d['stored_tokens']} stored tokens",
        file=out,
    )
    print("\nhistory (current branch):", file=out)
    print(f"{'id':>6} {'role':10} {'tokens':>6} {'first dropped by':24} content", file=out)
    for i in d["history"]:
        dropped = i["first_dropped_by"] or "-"
        print(
            f"{i['id']:6d} {i['role']:10} {i['token_count'] or 0:6d} {dropped:24} "
            f"{_preview(i['message'])}",
            file=out,
        )
    print_summaries(d["summaries"], out)
    print_cache(d.get("cache"), out)
    print("\nrequests:", file=out)
    print(
        f"{'request':24} {'created (UTC)':23} {'policy':12} {'status':>6} {'tokens':>13} "
        f"{'dropped':>9} {'reason':10} {'total ms':>9} {'upstream':>9} {'cached':>8} "
        f"{'stable':>6}",
        file=out,
    )
    for r in d["requests"]:
        t, dr, ms = r["tokens"], r["dropped"], r["latency_ms"]
        tokens = f"{t['before']}->{t['after']}"
        dropped = f"{dr['messages']}m/{dr['turns']}t"
        upstream = f"{ms['upstream']:.1f}" if ms["upstream"] is not None else "-"
        cache = r.get("cache") or {}
        cached = "-" if cache.get("cached_tokens") is None else str(cache["cached_tokens"])
        stable = "-" if cache.get("stable_prefix") is None else str(cache["stable_prefix"])
        print(
            f"{r['id']:24} {r['created_at'][:23]:23} {r['policy']:12} {r['status']:6d} "
            f"{tokens:>13} {dropped:>9} {dr['reason'] or '-':10} {ms['total'] or 0:9.1f} "
            f"{upstream:>9} {cached:>8} {stable:>6}",
            file=out,
        )
        if r["error"]:
            print(f"{'':24} error: {r['error']}", file=out)
        used = summary_use(r)
        if used:
            print(f"{'':24} {used}", file=out)


def print_cache(cache: dict[str, Any] | None, out: TextIO) -> None:
    """The session's prompt-cache hit ratio (the upstream's figures), in total and per policy."""
    if not cache or not cache["requests"]:
        print("\nprompt cache: no usage reported by the upstream", file=out)
        return

    def line(c: dict[str, Any]) -> str:
        ratio = "-" if c["hit_ratio"] is None else f"{c['hit_ratio']:.1%}"
        written = f", {c['cache_write_tokens']} written" if c["cache_write_tokens"] else ""
        return (
            f"{c['cached_tokens']} of {c['prompt_tokens']} prompt tokens cached ({ratio}) "
            f"over {c['requests']} requests{written}"
        )

    print(f"\nprompt cache: {line(cache)}", file=out)
    for policy, c in cache["by_policy"].items():
        print(f"  policy {policy}: {line(c)}", file=out)


def print_summaries(summaries: list[dict[str, Any]], out: TextIO) -> None:
    """Each stored summary: what it covers, who made it, its text, pinned facts and flags."""
    print(f"\nsummaries: {len(summaries) or 'none'}", file=out)
    for s in summaries:
        branch = "" if s["on_current_branch"] else " (not on the current branch)"
        after = f" after the first {s['start_unit']} turns" if s["start_unit"] else ""
        extends = f", extends #{s['previous_summary_id']}" if s["previous_summary_id"] else ""
        print(
            f"  #{s['id']} covers up to item {s['covers_item_id']}{after}{branch}{extends}; "
            f"{s['model'] or '-'}, prompt {s['prompt_hash'] or '-'}, "
            f"{(s['created_at'] or '')[:23]}",
            file=out,
        )
        usage = s["usage"] or {}
        tokens = f"{usage.get('prompt_tokens', '-')} in, {usage.get('completion_tokens', '-')} out"
        used_by = ", ".join(s["used_by"]) or "none"
        print(f"    usage: {tokens if usage else '-'}; forwarded by: {used_by}", file=out)
        for line in s["text"].splitlines():
            print(f"    | {line}", file=out)
        if s["facts"]:
            facts = "; ".join(f"{f.get('kind')} {f.get('value')}" for f in s["facts"])
            print(f"    pinned facts: {facts}", file=out)
        if s["flagged"]:
            print(f"    flagged (not in its source): {', '.join(s['flagged'])}", file=out)


def summary_use(r: dict[str, Any]) -> str:
    """A request's use of a summary in a line; empty when it had none to use."""
    used, fallback = r["summarized"], r["fallback"]
    if used is None or used["status"] == "none":
        return ""
    line = f"summary {used['status']}"
    if used["summary_id"] is not None:
        line += f" #{used['summary_id']}"
    if used["turns"] is not None:
        line += (
            f": {used['turns']} turns ({len(used['indexes'])} messages) in {used['tokens']} tokens"
        )
    if fallback:
        line += f" ({fallback})"
    if used["wait_ms"] is not None:
        line += f", waited {used['wait_ms']:.1f} ms"
    return line


async def _request(store: Store, ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    row = await store.request(ns.request_id)
    if row is None:
        print(f"no request {ns.request_id!r}", file=err)
        return 1
    ctx = await request_context(store, row)
    if ns.json:
        out.write(orjson.dumps(ctx, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        print_context(ctx, out, _preview)
    return 0


def _sessions(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    spec = StoreSpec(path=ns.db) if ns.db else _store_spec(ns.config, err)
    if spec is None:
        return 2

    async def work(store: Store) -> int:
        if ns.action == "list":
            page = await session_list(
                store,
                tenant=ns.tenant,
                limit=max(1, ns.limit),
                offset=max(0, ns.offset),
                session=ns.session or None,
            )
            if ns.json:
                out.write(orjson.dumps(page, option=orjson.OPT_INDENT_2).decode() + "\n")
            else:
                print_list(page, out)
            return 0
        if ns.action == "request":
            return await _request(store, ns, out, err)
        if ns.action == "purge":
            steps = await store.purge() or ["nothing to purge (docs/operations/deletion.md)"]
            out.writelines(f"{step}\n" for step in steps)
            return 0
        if (ref := await _resolve(store, ns.ids, err)) is None:
            return 1
        if ns.action == "delete":
            if not await store.delete_session(ref):
                print(f"no session {ref.key!r} for tenant {ref.tenant}", file=err)
                return 1
            print(f"deleted session {ref.key!r} of tenant {ref.tenant}", file=out)
            return 0
        if ns.action == "export":
            lines = await export_lines(store, ref)
            if lines is None:
                print(f"no session {ref.key!r} for tenant {ref.tenant}", file=err)
                return 1
            if ns.output:
                with open(ns.output, "wb") as f:
                    f.write(ndjson(lines))
            else:
                out.write(ndjson(lines).decode())
            return 0
        detail = await session_detail(store, ref)
        if detail is None:
            print(f"no session {ref.key!r} for tenant {ref.tenant}", file=err)
            return 1
        if ns.json:
            out.write(orjson.dumps(detail, option=orjson.OPT_INDENT_2).decode() + "\n")
        else:
            print_session(detail, out)
        return 0

    try:
        writes = ns.action in ("delete", "purge")
        return asyncio.run(_with_store(spec, work, read_only=not writes))
    except StoreUnavailable as exc:
        where = "--db" if ns.db else f"store.path in {ns.config}"
        print(f"error: {exc} (check {where})", file=err)
        return 2


def main(argv: Sequence[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    return run(_parser().parse_args(list(argv)), out, err)


def run(ns: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run a parsed ``sessions`` or ``replay`` command."""
    out = out or sys.stdout
    err = err or sys.stderr
    if ns.command == "sessions":
        return _sessions(ns, out, err)
    return run_replay(ns, out, err)
