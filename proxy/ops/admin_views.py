"""What the admin API and ``python -m proxy sessions`` show: views over a Store.

The views take a Store, not a request, so the command line shows exactly
what the API shows. Summaries are views over the stored chain: each is shown
with the item it covers up to and the requests that forwarded it, and each
request with what its summary stood in for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.context.calibration import Calibration
from proxy.ops.cache_views import cache_summary, request_cache
from proxy.ops.timeline import (
    context_entries,
    masked_by_index,
    recall_of,
    recall_view,
    request_chain,
    token_split,
)
from proxy.store.base import (
    SessionInfo,
    SessionRef,
    Store,
    StoredItem,
    StoredSummary,
    positions,
)

DEFAULT_PAGE = 50


def iso(timestamp: float | None) -> str | None:
    if timestamp is None:
        return None
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds")


def _turns(history: list[StoredItem]) -> int:
    return sum(1 for item in history if item.role == "user")


def session_view(info: SessionInfo, history: list[StoredItem]) -> dict[str, Any]:
    return {
        "tenant": info.tenant,
        "key": info.key,
        "created_at": iso(info.created_at),
        "last_activity": iso(info.updated_at),
        # User messages on the current branch: what a person would call turns.
        "turns": _turns(history),
        "messages": len(history),
        # Every stored item, other branches (edits, forks) included.
        "items": info.item_count,
        "request_count": info.request_count,
        "stored_tokens": info.stored_tokens,
    }


async def session_list(
    store: Store,
    *,
    tenant: str | None = None,
    limit: int = DEFAULT_PAGE,
    offset: int = 0,
    session: str | None = None,
) -> dict[str, Any]:
    """One page of sessions, most recent activity first; ``session``: only those whose
    key contains it, in any tenant (nobody needs the tenant hash to find one)."""
    infos = await store.list_sessions(
        tenant=tenant, limit=limit + 1, offset=offset, key_contains=session
    )
    page = infos[:limit]
    data = []
    for info in page:
        # Turns are counted on the current branch: one chain read per listed session,
        # bounded by the page size (an admin call, not the request path).
        history = await store.history(SessionRef(info.tenant, info.key))
        data.append(session_view(info, history))
    return {
        "object": "list",
        "data": data,
        "limit": limit,
        "offset": offset,
        "has_more": len(infos) > limit,
    }


def summarized_positions(row: Mapping[str, Any]) -> list[int]:
    """Positions (in the conversation as received) the request's summary stood in for.

    The policy's decision says how many messages it summarized
    (``dropped_by.summarized``) and where the summary ends (``covers``): they
    are the last that many dropped positions before it, repaired orphans
    aside (turns trimmed for the budget lie after it, or in the opening turns
    kept before it).
    """
    detail: Mapping[str, Any] = row.get("detail") or {}
    summary = detail.get("summary")
    dropped_by = detail.get("dropped_by")
    if not isinstance(summary, Mapping) or not isinstance(dropped_by, Mapping):
        return []
    covers, count = summary.get("covers"), dropped_by.get("summarized", 0)
    if not isinstance(covers, int) or not isinstance(count, int) or count <= 0:
        return []
    repaired = set(detail.get("repaired", []))
    dropped = positions(row["dropped_spans"])
    before = [i for i in dropped if i < covers and i not in repaired]
    return before[-count:]


def chain_ids(chain: Sequence[StoredItem] | None, at: Sequence[int]) -> list[int]:
    """The ids of the request chain's items at positions ``at`` (none without a chain:
    a failed call stores no messages, a forked branch is not the current one)."""
    if chain is None:
        return []
    return [chain[i].id for i in at if 0 <= i < len(chain)]


def dropped_ids(row: Mapping[str, Any], chain: Sequence[StoredItem] | None) -> list[int]:
    """The stored items the request left out (rows keep positions, as spans)."""
    return chain_ids(chain, positions(row["dropped_spans"])) if chain is not None else []


def summarized_item_ids(
    row: Mapping[str, Any], chain: Sequence[StoredItem] | None = None
) -> list[int]:
    """The stored items the request's summary stood in for (none when nothing was stored)."""
    return chain_ids(chain, summarized_positions(row))


def summarized_view(
    row: Mapping[str, Any], chain: Sequence[StoredItem] | None = None
) -> dict[str, Any] | None:
    """What the request did with a summary (None: its policy does not summarize).

    ``status`` is the ``X-Context-Summary`` header's value; the other fields
    describe the summary forwarded (none for ``none``, ``fallback`` and
    ``needed``).
    """
    detail: Mapping[str, Any] = row.get("detail") or {}
    summary = detail.get("summary")
    if not isinstance(summary, Mapping):
        return None
    return {
        "status": summary.get("status"),
        "summary_id": summary.get("id"),
        "wait_ms": summary.get("wait_ms"),
        # Turns folded into the forwarded summary, its tokens and pinned facts.
        "turns": summary.get("units"),
        "tokens": summary.get("tokens"),
        "facts": summary.get("facts"),
        "placement": summary.get("placement"),
        "indexes": summarized_positions(row),
        "item_ids": summarized_item_ids(row, chain),
    }


def summary_view(
    summary: StoredSummary, branch: set[int], used_by: Mapping[int, list[str]]
) -> dict[str, Any]:
    """A stored summary: the range it covers, its text and facts, and who forwarded it."""
    return {
        "id": summary.id,
        "created_at": iso(summary.created_at),
        # It covers the turns after the first ``start_unit`` up to this item.
        "covers_item_id": summary.covers_item_id,
        "start_unit": summary.start_unit,
        # An edited or forked history may have left the covered item off the current branch.
        "on_current_branch": summary.covers_item_id in branch,
        "previous_summary_id": summary.previous_summary_id,
        "model": summary.model,
        "prompt_hash": summary.prompt_hash,
        "usage": summary.usage,
        "text": summary.text,
        "facts": summary.facts,
        # Entities the summary states that its source never mentions.
        "flagged": summary.flagged,
        "used_by": used_by.get(summary.id, []),
    }


def request_view(
    row: Mapping[str, Any], chain: Sequence[StoredItem] | None = None
) -> dict[str, Any]:
    """A stored request row, grouped the way an audit reads it.

    ``chain`` (the stored items its positions name, see
    :func:`proxy.ops.timeline.request_chain`) gives the token split its
    per-message counts and the recalled turns their item ids.
    """
    detail: Mapping[str, Any] = row.get("detail") or {}
    summarized = summarized_view(row, chain)
    split = token_split(
        row,
        chain,
        summarized["indexes"] if summarized else [],
        summarized["tokens"] if summarized else None,
    )
    return {
        "id": row["id"],
        "created_at": iso(row["created_at"]),
        "endpoint": row["endpoint"],
        "route": row["route"],
        "policy": row["policy"],
        "mode": row.get("mode"),
        "model": row["model"],
        "stream": row["stream"],
        "status": row["status"],
        "upstream_status": row["upstream_status"],
        "incomplete": row["incomplete"],
        "error": row["error"],
        "messages": {"before": row["messages_before"], "after": row["messages_after"]},
        "tokens": {
            "before": row["tokens_before"],
            "after": row["tokens_after"],
            "saved": row["tokens_before"] - row["tokens_after"],
            "budget": detail.get("budget"),
            "calibration": detail.get("calibration", 1.0),
            # By fate: what was kept, clipped, masked, summarized, recalled, dropped.
            "split": split,
        },
        "dropped": {
            "reason": row["reason"],
            "turns": row["turns_dropped"],
            "messages": row["messages_dropped"],
            # Positions in the conversation as received: as stored (half-open ranges),
            # and expanded, with the items they name (the row's chain, when known).
            "spans": row["dropped_spans"],
            "indexes": positions(row["dropped_spans"]),
            "item_ids": dropped_ids(row, chain),
            "repaired": detail.get("repaired", []),
        },
        "clipped": detail.get("clipped", []),
        "summarized": summarized,
        # Turns recall brought back (with their scores), tool results masking replaced.
        "recalled": recall_view(recall_of(detail), chain),
        "masked": [
            {"index": i, "tokens_before": m.tokens_before, "tokens_after": m.tokens_after}
            for i, m in sorted(masked_by_index(detail).items())
        ],
        # The request row's recall entry as stored: outcome, spans, hits, tokens, time.
        "recall": detail.get("recall"),
        "fallback": detail.get("fallback"),
        # A compaction asked or answered (docs/guides/compaction.md): what the proxy did.
        "compaction": detail.get("compaction"),
        "latency_ms": {"total": row["total_ms"], "upstream": row["upstream_ms"]},
        "usage": row["usage"],
        # The upstream's prompt-cache figures, the stable prefix and the hints sent.
        "cache": request_cache(row),
        "items": {
            "first": row.get("first_item_id"),
            "last": row.get("last_item_id"),
            "reply": row.get("reply_item_id"),
        },
    }


def item_view(
    item: StoredItem,
    first_dropped_by: dict[int, str],
    dropped_last: set[int],
    first_summarized_by: dict[int, str],
) -> dict[str, Any]:
    return {
        "id": item.id,
        "parent_id": item.parent_id,
        "role": item.role,
        "token_count": item.token_count,
        "status": item.status,
        "created_at": iso(item.created_at),
        "content_hash": item.content_hash,
        # "Why did the model forget X?": the first request that left X out, and
        # whether the newest request left it out too.
        "first_dropped_by": first_dropped_by.get(item.id),
        # ... and the first that forwarded a summary of X instead (not forgotten, then).
        "first_summarized_by": first_summarized_by.get(item.id),
        "dropped_in_last_request": item.id in dropped_last,
        "message": item.message,
    }


async def session_detail(
    store: Store, ref: SessionRef, calibration: Calibration | None = None
) -> dict[str, Any] | None:
    """Everything stored for a session; None when there is no such session."""
    info = await store.get_session(ref)
    if info is None:
        return None
    history = await store.history(ref)
    rows = await store.requests(ref)
    first_dropped_by: dict[int, str] = {}
    first_summarized_by: dict[int, str] = {}
    used_by: dict[int, list[str]] = {}
    position_of = {item.id: i for i, item in enumerate(history)}
    # Rows keep positions: the items they name are their chain's (on the current branch).
    chains = [request_chain(row, history, position_of) for row in rows]
    for row, chain in zip(rows, chains, strict=True):
        for item_id in dropped_ids(row, chain):
            first_dropped_by.setdefault(item_id, row["id"])
        for item_id in summarized_item_ids(row, chain):
            first_summarized_by.setdefault(item_id, row["id"])
        summarized = summarized_view(row, chain)
        if summarized is not None and isinstance(summarized["summary_id"], int):
            used_by.setdefault(summarized["summary_id"], []).append(row["id"])
    stored = [(r, c) for r, c in zip(rows, chains, strict=True) if r["last_item_id"] is not None]
    dropped_last = set(dropped_ids(*stored[-1])) if stored else set()
    models = {r["model"] for r in rows if r["model"]}
    branch = {item.id for item in history}
    return {
        "object": "session",
        **session_view(info, history),
        "history": [
            item_view(i, first_dropped_by, dropped_last, first_summarized_by) for i in history
        ],
        # Views over the stored chain, oldest first.
        "summaries": [summary_view(s, branch, used_by) for s in await store.summaries(ref)],
        "requests": [request_view(r, c) for r, c in zip(rows, chains, strict=True)],
        # Cached ÷ prompt tokens, as the upstream reported them: in total and per policy.
        "cache": cache_summary(rows),
        "calibration": []
        if calibration is None
        else [
            c
            for c in calibration.snapshot()
            if c["model"] in models or not models.isdisjoint(c["client_models"])
        ],
    }


async def _row_chain(
    store: Store, row: Mapping[str, Any]
) -> tuple[SessionRef | None, list[StoredItem], list[StoredItem] | None]:
    """The row's session, that session's current branch, and the items the row names."""
    key = row.get("session_key")
    if not isinstance(key, str):
        return None, [], None
    ref = SessionRef(row["tenant"], key)
    history = await store.history(ref)
    position_of = {item.id: i for i, item in enumerate(history)}
    return ref, history, request_chain(row, history, position_of)


async def request_detail(store: Store, row: Mapping[str, Any]) -> dict[str, Any]:
    """``request_view`` of one row, as the session view shows it."""
    _, _, chain = await _row_chain(store, row)
    return request_view(row, chain)


async def request_context(store: Store, row: Mapping[str, Any]) -> dict[str, Any]:
    """What one request forwarded, item by item, beside what its session stores.

    ``entries`` lists every message the request was sent, in order, with its
    fate (kept, clipped, masked, summarized, recalled with its score,
    dropped and why), its tokens as sent and as forwarded and the stored
    message; the summary it forwarded stands before the first message it
    stands in for, with its text, pinned facts and flagged entities.
    ``chain`` is ``current_branch`` when the positions were matched to
    stored items, ``unavailable`` otherwise (a failed call stores no
    messages; an edited history moved the session to another branch).
    """
    ref, history, chain = await _row_chain(store, row)
    view = request_view(row, chain)
    summarized = view["summarized"]
    summary: dict[str, Any] | None = None
    if summarized is not None and isinstance(summarized["summary_id"], int) and ref is not None:
        stored = {s.id: s for s in await store.summaries(ref)}.get(summarized["summary_id"])
        summary = {
            "summary_id": summarized["summary_id"],
            "tokens": summarized["tokens"],
            "turns": summarized["turns"],
            "placement": summarized["placement"],
            "stands_in_for": len(summarized["indexes"]),
            "text": stored.text if stored else None,
            "facts": stored.facts if stored else [],
            "flagged": stored.flagged if stored else [],
        }
    reply_id = row.get("reply_item_id")
    reply = next((item for item in history if item.id == reply_id), None)
    return {
        "object": "request.context",
        "request": view,
        "chain": "current_branch" if chain is not None else "unavailable",
        "entries": context_entries(
            row, chain, summarized["indexes"] if summarized else [], summary
        ),
        "reply": None
        if reply is None
        else {"item_id": reply.id, "token_count": reply.token_count, "message": reply.message},
    }


async def export_lines(store: Store, ref: SessionRef) -> list[dict[str, Any]] | None:
    """The session as JSON Lines records: the session, its items, summaries, requests."""
    info = await store.get_session(ref)
    if info is None:
        return None
    history = await store.history(ref)
    lines: list[dict[str, Any]] = [{"type": "session", **session_view(info, history)}]
    for item in history:
        lines.append(
            {
                "type": "item",
                "id": item.id,
                "parent_id": item.parent_id,
                "role": item.role,
                "token_count": item.token_count,
                "status": item.status,
                "created_at": item.created_at,
                "content_hash": item.content_hash,
                "message": item.message,
            }
        )
    lines.extend({"type": "summary", **asdict(s)} for s in await store.summaries(ref))
    lines.extend({"type": "request", **row} for row in await store.requests(ref))
    return lines


def ndjson(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)
