"""The in-memory store: the fake for tests, with exactly the SQLite store's semantics.

Messages are kept as JSON bytes and decoded on every read, like the SQLite
store, so a caller mutating a message it stored or read changes nothing here.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, ClassVar

import orjson

from proxy.store.base import (
    ExchangeResult,
    MessageIn,
    RequestRecord,
    ResponseIn,
    SessionInfo,
    SessionRef,
    Storable,
    StoredItem,
    StoredResponse,
    StoredSummary,
    SummaryIn,
    chain_path_hashes,
    dropped_item_ids,
    normalize_request,
    request_row,
)
from proxy.store.memory_search import MemoryRecallIndex
from proxy.store.pruning import exclusive_suffix
from proxy.store.registry import Backend, StoreSpec
from proxy.store.sqlite_summaries import covering_summaries
from proxy.store.vectors import ItemVector, StoredVectors, VectorIndex


@dataclass
class _Session:
    id: int
    tenant: str
    key: str
    created_at: float
    updated_at: float
    head_item_id: int | None = None


class MemoryStore:
    backend: ClassVar[str] = "memory"

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._sessions: dict[tuple[str, str], _Session] = {}
        # Items without their message; the message lives as bytes in _messages.
        self._items: dict[int, StoredItem] = {}
        self._messages: dict[int, bytes] = {}
        self._by_path: dict[int, dict[str, int]] = {}  # session id -> path hash -> item id
        self._requests: dict[str, bytes] = {}  # insertion order is the tie-break
        # (tenant, response id) -> the response row; its JSON as bytes, like messages.
        self._responses: dict[tuple[str, str], tuple[StoredResponse, bytes]] = {}
        self._next_session_id = 1
        self._next_item_id = 1
        # session id -> its summaries as JSON bytes, oldest first.
        self._summaries: dict[int, list[bytes]] = {}
        self._next_summary_id = 1
        # session id -> its items' vectors in the order stored (the cursor is the count).
        self._vectors: dict[int, list[ItemVector]] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def record_exchange_soon(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> asyncio.Future[ExchangeResult | None]:
        return asyncio.ensure_future(self.record_exchange(session, conversation, reply, request))

    async def record_exchange(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> ExchangeResult | None:
        now = time.time()
        created_at = request.created_at or now
        async with self._lock:
            # Everything that can fail happens before the first mutation, so a
            # rejected exchange leaves nothing behind, as the SQLite rollback does.
            if request.id in self._requests:
                raise ValueError(f"request id already stored: {request.id!r}")
            chain = [*conversation, *([reply] if reply is not None else [])]
            encoded = [orjson.dumps(m.message) for m in chain]
            # Encoded now only to fail now (not JSON) rather than half-way through.
            orjson.dumps((request.usage, request.detail))

            if session is None:
                self._add_request(request, None, request.tenant, request.session_key, created_at)
                return None
            if not chain:
                existing = self._sessions.get((session.tenant, session.key))
                session_id = None if existing is None else existing.id
                self._add_request(request, session_id, session.tenant, session.key, created_at)
                return None if session_id is None else ExchangeResult(session_id, [], None, 0)

            row = self._upsert_session(session, now)
            by_path = self._by_path[row.id]
            hashes = chain_path_hashes([m.content_hash for m in chain])
            ids: list[int] = []
            new_messages = 0
            parent: int | None = None
            for position, (message, path, data) in enumerate(
                zip(chain, hashes, encoded, strict=True)
            ):
                item_id = by_path.get(path)
                if item_id is None:
                    item_id = self._add_item(row.id, parent, path, message, data, now)
                    by_path[path] = item_id
                    new_messages += position < len(conversation)
                ids.append(item_id)
                parent = item_id
            row.head_item_id = ids[-1]
            item_ids = ids[: len(conversation)]
            reply_id = ids[-1] if reply is not None else None
            self._add_request(
                request, row.id, session.tenant, session.key, created_at, item_ids, reply_id
            )
            return ExchangeResult(row.id, item_ids, reply_id, new_messages)

    def _upsert_session(self, session: SessionRef, now: float) -> _Session:
        row = self._sessions.get((session.tenant, session.key))
        if row is None:
            row = _Session(self._next_session_id, session.tenant, session.key, now, now)
            self._next_session_id += 1
            self._sessions[(session.tenant, session.key)] = row
            self._by_path[row.id] = {}
        row.updated_at = now
        return row

    def _add_item(
        self,
        session_id: int,
        parent_id: int | None,
        path: str,
        message: Storable,
        data: bytes,
        now: float,
    ) -> int:
        item_id = self._next_item_id
        self._next_item_id += 1
        self._items[item_id] = StoredItem(
            id=item_id,
            session_id=session_id,
            parent_id=parent_id,
            path_hash=path,
            content_hash=message.content_hash,
            role=message.role,
            token_count=message.token_count,
            message={},
            status=message.status,
            created_at=now,
        )
        self._messages[item_id] = data
        return item_id

    def _add_request(
        self,
        request: RequestRecord,
        session_id: int | None,
        tenant: str,
        session_key: str | None,
        created_at: float,
        item_ids: Sequence[int] = (),
        reply_id: int | None = None,
    ) -> None:
        row = request_row(
            request,
            session_id=session_id,
            tenant=tenant,
            session_key=session_key,
            dropped_item_ids=dropped_item_ids(request, item_ids),
            first_item_id=item_ids[0] if item_ids else None,
            last_item_id=item_ids[-1] if item_ids else None,
            reply_item_id=reply_id,
            created_at=created_at,
        )
        self._requests[request.id] = orjson.dumps(row)

    async def history(self, session: SessionRef, *, shared: bool = False) -> list[StoredItem]:
        async with self._lock:
            row = self._sessions.get((session.tenant, session.key))
            chain: list[StoredItem] = []
            item_id = None if row is None else row.head_item_id
            while item_id is not None:
                chain.append(self._item(item_id))
                item_id = chain[-1].parent_id
        return chain[::-1]

    async def searchable(self, session: SessionRef) -> list[tuple[int, int, str, int | None, Any]]:
        """Every item of the session (any branch): id, chain position, content hash, token
        count, message.

        For the recall index fake (proxy/store/memory_search.py).
        """
        async with self._lock:
            row = self._sessions.get((session.tenant, session.key))
            if row is None:
                return []
            out = []
            for item_id in self._by_path[row.id].values():
                item = self._items[item_id]
                depth, parent = 0, item.parent_id
                while parent is not None:
                    depth, parent = depth + 1, self._items[parent].parent_id
                message = orjson.loads(self._messages[item_id])
                out.append((item_id, depth, item.content_hash, item.token_count, message))
            return out

    def _item(self, item_id: int) -> StoredItem:
        return replace(self._items[item_id], message=orjson.loads(self._messages[item_id]))

    async def get_session(self, session: SessionRef) -> SessionInfo | None:
        async with self._lock:
            row = self._sessions.get((session.tenant, session.key))
            return None if row is None else self._info(row)

    async def list_sessions(
        self,
        tenant: str | None = None,
        limit: int = 50,
        offset: int = 0,
        key_contains: str | None = None,
    ) -> list[SessionInfo]:
        async with self._lock:
            rows = [
                s
                for s in self._sessions.values()
                if (tenant is None or s.tenant == tenant)
                and (key_contains is None or key_contains in s.key)
            ]
            rows.sort(key=lambda s: (s.updated_at, s.id), reverse=True)
            return [self._info(row) for row in rows[offset : offset + limit]]

    def _info(self, row: _Session) -> SessionInfo:
        items = [self._items[i] for i in self._by_path[row.id].values()]
        return SessionInfo(
            id=row.id,
            tenant=row.tenant,
            key=row.key,
            created_at=row.created_at,
            updated_at=row.updated_at,
            head_item_id=row.head_item_id,
            item_count=len(items),
            request_count=len(self._named_requests(row.tenant, row.key)),
            stored_tokens=sum(item.token_count or 0 for item in items),
        )

    def _named_requests(self, tenant: str, key: str) -> list[dict[str, Any]]:
        rows = [normalize_request(orjson.loads(data)) for data in self._requests.values()]
        named = [r for r in rows if r["tenant"] == tenant and r["session_key"] == key]
        named.sort(key=lambda r: r["created_at"])  # stable: insertion order breaks ties
        return named

    async def requests(self, session: SessionRef) -> list[dict[str, Any]]:
        """Every request that named the session, those made before it existed included."""
        async with self._lock:
            return self._named_requests(session.tenant, session.key)

    async def request(self, request_id: str) -> dict[str, Any] | None:
        async with self._lock:
            data = self._requests.get(request_id)
            return None if data is None else normalize_request(dict(orjson.loads(data)))

    async def delete_session(self, session: SessionRef) -> bool:
        async with self._lock:
            for request_id, data in list(self._requests.items()):
                named = orjson.loads(data)
                if named["tenant"] == session.tenant and named["session_key"] == session.key:
                    del self._requests[request_id]
            row = self._sessions.pop((session.tenant, session.key), None)
            if row is None:
                return False
            self._drop_session(row)
            return True

    async def purge(self) -> list[str]:
        """Nothing to do: each deletion removes every key, posting and vector at once."""
        return []

    async def delete_idle_sessions(self, older_than: float) -> int:
        async with self._lock:
            idle = [s for s in self._sessions.values() if s.updated_at < older_than]
            names = {(s.tenant, s.key) for s in idle}
            ids = {s.id for s in idle}
            for request_id, data in list(self._requests.items()):
                row = orjson.loads(data)
                linked = row["session_id"] in ids
                orphan = row["session_id"] is None and (row["tenant"], row["session_key"]) in names
                if linked or orphan:
                    del self._requests[request_id]
            for row in idle:
                del self._sessions[(row.tenant, row.key)]
                self._drop_session(row)
            return len(idle)

    def _drop_session(self, row: _Session) -> None:
        for item_id in self._by_path.pop(row.id).values():
            del self._items[item_id]
            del self._messages[item_id]
        # The SQLite store's ON DELETE CASCADE.
        self._summaries.pop(row.id, None)
        self._vectors.pop(row.id, None)
        for key, (stored, _) in list(self._responses.items()):
            if stored.session_id == row.id:
                del self._responses[key]

    # -- vectors (proxy/store/vectors.py: this store is its own VectorIndex) ----

    async def put_vectors(self, session: SessionRef, vectors: Sequence[ItemVector]) -> None:
        async with self._lock:
            row = self._sessions.get((session.tenant, session.key))
            if row is None:
                return
            stored = self._vectors.setdefault(row.id, [])
            have = {v.item_id for v in stored}
            for v in vectors:
                item = self._items.get(v.item_id)
                if item is not None and item.session_id == row.id and v.item_id not in have:
                    stored.append(replace(v, content_hash=item.content_hash))
                    have.add(v.item_id)

    async def vectors(self, session: SessionRef, *, after: int = 0) -> StoredVectors:
        async with self._lock:
            row = self._sessions.get((session.tenant, session.key))
            if row is None:
                return StoredVectors(None, [], after)
            stored = self._vectors.get(row.id, [])
            # An item pruned since (a deleted response's) takes its vector with it;
            # the list keeps its entry so that cursors stay positions in it.
            rows = [v for v in stored[after:] if v.item_id in self._items]
            return StoredVectors(row.id, rows, max(after, len(stored)))

    # -- Responses API ----------------------------------------------------------

    async def record_response(
        self,
        session: SessionRef,
        conversation: Sequence[Storable],
        output: Sequence[MessageIn],
        response: ResponseIn,
        request: RequestRecord,
    ) -> ExchangeResult:
        now = time.time()
        created_at = request.created_at or now
        async with self._lock:
            # Everything that can fail happens before the first mutation (see record_exchange).
            if request.id in self._requests:
                raise ValueError(f"request id already stored: {request.id!r}")
            chain = [*conversation, *output]
            encoded = [orjson.dumps(m.message) for m in chain]
            data = orjson.dumps(response.response)
            orjson.dumps((request.usage, request.detail))

            row = self._upsert_session(session, now)
            by_path = self._by_path[row.id]
            hashes = chain_path_hashes([m.content_hash for m in chain])
            ids: list[int] = []
            new_messages = 0
            parent: int | None = None
            for position, (item, path, raw) in enumerate(zip(chain, hashes, encoded, strict=True)):
                item_id = by_path.get(path)
                if item_id is None:
                    item_id = self._add_item(row.id, parent, path, item, raw, now)
                    by_path[path] = item_id
                    new_messages += position < len(conversation)
                ids.append(item_id)
                parent = item_id
            if ids:
                row.head_item_id = ids[-1]
            item_ids = ids[: len(conversation)]
            reply_id = ids[-1] if output else None
            self._responses[(session.tenant, response.id)] = (
                StoredResponse(
                    id=response.id,
                    tenant=session.tenant,
                    session_id=row.id,
                    session_key=session.key,
                    head_item_id=ids[-1] if ids else None,
                    input_head_item_id=item_ids[-1] if item_ids else None,
                    previous_response_id=response.previous_response_id,
                    model=response.model,
                    status=response.status,
                    response={},
                    created_at=created_at,
                ),
                data,
            )
            self._add_request(
                request, row.id, session.tenant, session.key, created_at, item_ids, reply_id
            )
            return ExchangeResult(
                row.id, item_ids, reply_id, new_messages, tuple(ids[len(conversation) :])
            )

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        async with self._lock:
            found = self._responses.get((tenant, response_id))
            if found is None:
                return None
            stored, data = found
            return replace(stored, response=orjson.loads(data))

    async def response_exists(self, response_id: str) -> bool:
        async with self._lock:
            return any(key[1] == response_id for key in self._responses)

    async def response_chain(self, tenant: str, response_id: str) -> list[StoredItem]:
        return await self._chain_from(tenant, response_id, input_only=False)

    async def response_input_items(self, tenant: str, response_id: str) -> list[StoredItem]:
        return await self._chain_from(tenant, response_id, input_only=True)

    async def _chain_from(
        self, tenant: str, response_id: str, *, input_only: bool
    ) -> list[StoredItem]:
        async with self._lock:
            found = self._responses.get((tenant, response_id))
            chain: list[StoredItem] = []
            if found is not None:
                stored = found[0]
                item_id = stored.input_head_item_id if input_only else stored.head_item_id
                while item_id is not None:
                    chain.append(self._item(item_id))
                    item_id = chain[-1].parent_id
        return chain[::-1]

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        """The mapping and what only this response holds (proxy/store/pruning.py)."""
        async with self._lock:
            found = self._responses.pop((tenant, response_id), None)
            if found is None:
                return False
            stored = found[0]
            row = self._sessions[(tenant, stored.session_key)]
            references: set[int] = set()
            for other, _ in self._responses.values():
                if other.session_id == row.id:
                    references.update((other.head_item_id or 0, other.input_head_item_id or 0))
            for request_id, data in list(self._requests.items()):
                named = orjson.loads(data)
                if (named["tenant"], named["session_key"]) != (tenant, row.key):
                    continue
                if named["detail"].get("response_id") == response_id:
                    del self._requests[request_id]
                else:
                    references.update((named["last_item_id"] or 0, named["reply_item_id"] or 0))
            if row.head_item_id is not None and row.head_item_id != stored.head_item_id:
                references.add(row.head_item_id)
            by_path = self._by_path[row.id]
            children: dict[int, int] = {}
            for item_id in by_path.values():
                parent = self._items[item_id].parent_id
                if parent is not None:
                    children[parent] = children.get(parent, 0) + 1
            gone = exclusive_suffix(
                stored.head_item_id,
                lambda i: self._items[i].parent_id,
                lambda i: children.get(i, 0),
                references,
            )
            survivor = self._items[gone[-1]].parent_id if gone else None
            for item_id in gone:
                del by_path[self._items.pop(item_id).path_hash]
                del self._messages[item_id]
            if gone:
                # Vectors: entries stay (cursors are positions in the list), emptied.
                vectors = self._vectors.get(row.id, [])
                vectors[:] = [
                    replace(v, content_hash="", vector=b"") if v.item_id in gone else v
                    for v in vectors
                ]
                summaries = self._summaries.get(row.id, [])
                summaries[:] = [d for d in summaries if _summary(d).covers_item_id not in gone]
            if row.head_item_id in gone:
                row.head_item_id = survivor
            owned = any(s.session_id == row.id for s, _ in self._responses.values())
            if not by_path and not owned and not self._named_requests(tenant, row.key):
                del self._sessions[(tenant, row.key)]
                self._drop_session(row)
            return True

    # -- summaries ----------------------------------------------------------------

    async def save_summary(
        self, session: SessionRef, covered: Sequence[Storable], summary: SummaryIn
    ) -> StoredSummary:
        if not covered:
            raise ValueError("a summary must cover at least one item")
        now = time.time()
        async with self._lock:
            encoded = [orjson.dumps(m.message) for m in covered]
            hashes = chain_path_hashes([m.content_hash for m in covered])
            row = self._sessions.get((session.tenant, session.key))
            # Created if new; an existing session's updated_at does not move (as in SQLite).
            row = row if row is not None else self._upsert_session(session, now)
            rows = self._summaries.setdefault(row.id, [])
            for data in rows:
                found = _summary(data)
                if (found.covers_path_hash, found.start_unit) == (hashes[-1], summary.start_unit):
                    return found
            by_path = self._by_path[row.id]
            parent: int | None = None
            for message, path, data in zip(covered, hashes, encoded, strict=True):
                item_id = by_path.get(path)
                if item_id is None:
                    item_id = self._add_item(row.id, parent, path, message, data, now)
                    by_path[path] = item_id
                parent = item_id
            assert parent is not None  # covered is not empty
            stored = StoredSummary(
                id=self._next_summary_id,
                session_id=row.id,
                covers_item_id=parent,
                covers_path_hash=hashes[-1],
                start_unit=summary.start_unit,
                previous_summary_id=summary.previous_summary_id,
                text=summary.text,
                facts=[dict(f) for f in summary.facts],
                flagged=list(summary.flagged),
                model=summary.model,
                prompt_hash=summary.prompt_hash,
                usage=summary.usage,
                created_at=now,
            )
            rows.append(orjson.dumps(asdict(stored)))
            self._next_summary_id += 1
            return _summary(rows[-1])

    async def summaries(self, session: SessionRef) -> list[StoredSummary]:
        async with self._lock:
            row = self._sessions.get((session.tenant, session.key))
            return [] if row is None else [_summary(d) for d in self._summaries.get(row.id, [])]

    async def summaries_for(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary]:
        async with self._lock:
            return self._covering(session, path_hashes, limit)

    def summaries_known(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary] | None:
        # Every write changes the dicts without a pause under the lock: read as they are.
        return self._covering(session, path_hashes, limit)

    def _covering(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int
    ) -> list[StoredSummary]:
        row = self._sessions.get((session.tenant, session.key))
        if row is None:
            return []
        found = [_summary(d) for d in self._summaries.get(row.id, [])]
        return covering_summaries(found, path_hashes, limit)


def _summary(data: bytes) -> StoredSummary:
    return StoredSummary(**orjson.loads(data))


def _build(spec: StoreSpec) -> MemoryStore:
    return MemoryStore()


def _vectors(store: MemoryStore) -> VectorIndex:
    return store  # it keeps its vectors itself


BACKEND: Backend[MemoryStore] = Backend("memory", _build, MemoryRecallIndex, _vectors)
