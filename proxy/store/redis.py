"""The Redis store: the Store protocol on Redis alone, for teams that run nothing else.

Sessions, the item tree, request rows, responses and summaries live in Redis
hashes, lists and sorted sets (layout: proxy/store/redis_scripts.py). Every
write is one Lua script, so an exchange is stored whole or not at all, and
instances sharing the server see each other's writes at once. With a TTL
(``session.ttl``) every key of a session expires natively a grace period
after its last activity: the proxy's own sweep (``delete_idle_sessions``)
deletes idle sessions first, and Redis expires whatever no sweep reached
(no instance running), leaving only index entries that reads skip and drop.

Like the SQLite store, a per-instance cache of each session's last stored
chain (proxy/store/chains.py) means a resent history is neither hashed nor
sent again: only the items after the known prefix cross the network. The
script checks that the cached session id is still the session's (another
instance may have deleted it and a new one taken its name) and the write is
retried in full when not.

Needs Redis 7.0 or newer (script flags). Not for Redis Cluster: a session's
keys are named by ids the scripts allocate, so they cannot be declared up front.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import orjson
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from proxy.store import redis_codec as codec
from proxy.store import redis_queries as queries
from proxy.store import redis_scripts as scripts
from proxy.store.base import (
    CacheBudget,
    ExchangeResult,
    FencedOut,
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
)
from proxy.store.chains import ChainCache
from proxy.store.redis_history import RedisHistoryCache
from proxy.store.redis_search import RedisRecallIndex, index_terms
from proxy.store.redis_vectors import RedisVectorIndex
from proxy.store.redis_writes import RETRY, RecordCall
from proxy.store.registry import Backend, StoreSpec
from proxy.store.sqlite_summaries import covering_summaries
from proxy.telemetry.logging import get_logger

log = get_logger()

# Sessions deleted per script call by the sweep, so no call blocks Redis for long.
_SWEEP_BATCH = 200
MIN_REDIS = (7, 0)


class RedisStoreError(RuntimeError):
    """The Redis server cannot serve as a store (unreachable, too old)."""


class RedisStore:
    backend: ClassVar[str] = "redis"

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "ctxproxy:store:",
        ttl_s: float | None = None,
        expire_grace_s: float | None = None,
        max_connections: int = 64,
        timeout_s: float = 5.0,
        caches: CacheBudget | None = None,
    ) -> None:
        self.url = url
        self.prefix = prefix
        self.ttl_s = ttl_s
        # Past the TTL, the sweep (every tenth of it, at most 5 minutes) gets
        # the first go; native expiry is the backstop.
        if expire_grace_s is None and ttl_s is not None:
            expire_grace_s = min(300.0, ttl_s / 10) + 60.0
        self.expire_grace_s = expire_grace_s or 0.0
        self.max_connections = max_connections
        self.timeout_s = timeout_s
        budget = caches or CacheBudget()
        self._chains = ChainCache(max_bytes=budget.chains)
        self._histories = RedisHistoryCache(max_bytes=budget.histories)
        # What puts an item's words in the session's recall index (proxy/store/redis_search.py).
        self._index: codec.Words | None = index_terms
        self._client: Redis | None = None
        self._scripts: dict[str, AsyncScript] = {}
        # Exchanges waiting for the next pipeline, and the task that sends them.
        self._queue: list[tuple[RecordCall, asyncio.Future[Any]]] = []
        self._flusher: asyncio.Task[None] | None = None

    @property
    def _ttl_ms(self) -> str:
        if self.ttl_s is None:
            return "0"
        return str(max(1, round((self.ttl_s + self.expire_grace_s) * 1000)))

    async def open(self) -> None:
        client = Redis.from_url(
            self.url,
            max_connections=self.max_connections,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
        )
        try:
            info = await client.info()
        except (RedisError, OSError) as exc:
            await client.aclose()
            raise RedisStoreError(
                f"store: cannot reach Redis at {codec.safe_url(self.url)}: {exc}"
            ) from exc
        version = tuple(int(p) for p in str(info.get("redis_version", "0")).split(".")[:2])
        if version < MIN_REDIS:
            await client.aclose()
            raise RedisStoreError(
                f"store: Redis at {codec.safe_url(self.url)} is {info.get('redis_version')};"
                " the Redis store needs 7.0 or newer"
            )
        policy = info.get("maxmemory_policy", "noeviction")
        if policy != "noeviction":
            # An evicted key is part of a session gone: history, counts and rows disagree.
            log.warning("redis_store_evicts_keys", maxmemory_policy=policy, wanted="noeviction")
        sources = {name: getattr(scripts, name) for name in _WRITE_SCRIPTS}
        sources |= {name: getattr(queries, name) for name in _READ_SCRIPTS}
        self._scripts = {name: client.register_script(src) for name, src in sources.items()}
        self._client = client

    async def close(self) -> None:
        if self._flusher is not None:
            # Writes already queued are sent first; their callers see any error.
            await asyncio.gather(self._flusher, return_exceptions=True)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    @property
    def client(self) -> Redis:
        """The open client (the vector index's scripts run on it)."""
        if self._client is None:
            raise RuntimeError("RedisStore is not open")
        return self._client

    async def _run(self, name: str, *args: str | bytes | int) -> Any:
        if self._client is None:
            raise RuntimeError("RedisStore is not open")
        return await self._scripts[name](args=[self.prefix, *args])

    # -- exchanges ----------------------------------------------------------------

    def record_exchange_soon(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> asyncio.Future[ExchangeResult | None]:
        """``record_exchange``, queued now; the future has its result once stored.

        Exchanges queued while a batch is on the wire go out together in the
        next one: one pipeline of scripts, each still atomic by itself (what
        SQLite's group commit is to its writer). No task per exchange.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ExchangeResult | None] = loop.create_future()
        output = [reply] if reply is not None else []
        try:
            call = RecordCall(
                self._chains,
                self._ttl_ms,
                self._index,
                time.time(),
                session,
                conversation,
                output,
                request,
            )
            call.args()
        except (TypeError, ValueError) as exc:  # not JSON: refused before anything is sent
            future.set_exception(exc)
            return future
        self._queue.append((call, future))
        if self._flusher is None:
            self._flusher = loop.create_task(self._flush(), name="redis-store-writes")
        return future

    async def record_exchange(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> ExchangeResult | None:
        """Store one exchange atomically (one script; see ``Store.record_exchange``).

        A failed call (empty conversation, no reply) leaves the session as it
        was, head, ``updated_at`` and TTL included.
        """
        return await self.record_exchange_soon(session, conversation, reply, request)

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                await self._send(batch)
        finally:
            self._flusher = None
            # Cancelled (the loop is closing): what is still queued is not stored.
            for _, future in self._queue:
                future.cancel()
            self._queue = []

    async def _send(self, batch: list[tuple[RecordCall, asyncio.Future[Any]]]) -> None:
        try:
            if self._client is None:
                raise RuntimeError("RedisStore is not open")
            pipe = self._client.pipeline(transaction=False)
            sha = self._scripts["RECORD"].sha
            for call, _ in batch:
                pipe.evalsha(sha, 0, self.prefix, *call.args())
            outs = await pipe.execute(raise_on_error=False)
        except asyncio.CancelledError:
            for _, future in batch:
                future.cancel()
            raise
        except Exception as exc:
            # Whatever stops the batch (Redis down or gone), each of its callers gets it.
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        if any(isinstance(out, NoScriptError) for out in outs):
            # Redis lost its scripts (a restart): load RECORD again; those calls go again.
            self._scripts["RECORD"].sha = await self._client.script_load(
                self._scripts["RECORD"].script
            )
        for (call, future), out in zip(batch, outs, strict=True):
            try:
                if isinstance(out, Exception) and not isinstance(out, NoScriptError):
                    raise out
                result = RETRY if isinstance(out, Exception) else call.settle(out)
            except (RedisError, ValueError, FencedOut) as exc:
                if not future.done():
                    future.set_exception(exc)
                continue
            if result is RETRY:  # in the next batch, not one round trip at a time
                self._queue.append((call, future))
            elif not future.done():
                future.set_result(result)

    async def _call(self, call: RecordCall) -> Any:
        """One RECORD call on its own, again until it settles."""
        while True:
            result = call.settle(await self._run("RECORD", *call.args()))
            if result is not RETRY:
                return result

    async def history(self, session: SessionRef, *, shared: bool = False) -> list[StoredItem]:
        """The chain, from this instance's cache once Redis says it is current."""
        return await self._histories.history(self._run, session, shared=shared)

    async def advance_fence(self, session: SessionRef, token: int) -> None:
        """A new holder of the session's lock: from now on, writes with older tokens are refused.

        Called when the lock is taken, before the holder reads anything (as
        PostgreSQL's), so a holder whose lease lapsed cannot write after the
        next holder began, whoever writes first: RECORD compares its token with
        the session's newest one.
        """
        await self._run("ADVANCE_FENCE", session.tenant, session.key, str(token))

    async def get_session(self, session: SessionRef) -> SessionInfo | None:
        out = await self._run("GET_SESSION", session.tenant, session.key)
        return codec.infos(out)[0] if out else None

    async def list_sessions(
        self,
        tenant: str | None = None,
        limit: int = 50,
        offset: int = 0,
        key_contains: str | None = None,
    ) -> list[SessionInfo]:
        if limit <= 0:
            return []
        if key_contains is not None:
            args = (tenant or "", max(0, offset), limit, key_contains)
            return codec.infos(await self._run("LIST_SESSIONS_MATCHING", *args))
        return codec.infos(await self._run("LIST_SESSIONS", tenant or "", max(0, offset), limit))

    async def requests(self, session: SessionRef) -> list[dict[str, Any]]:
        """Every request that named the session, those made before it existed included."""
        rows = [
            codec.row(data) for data in await self._run("REQUESTS", session.tenant, session.key)
        ]
        rows.sort(key=lambda r: r["created_at"])  # stable: the order written breaks ties
        return rows

    async def request(self, request_id: str) -> dict[str, Any] | None:
        data = await self._run("REQUEST", request_id)
        return None if data is None else codec.row(data)

    async def delete_session(self, session: SessionRef) -> bool:
        """Delete the session, its items, summaries, responses and every request that named it."""
        self._chains.forget(session)
        self._histories.forget(session)
        return bool(await self._run("DELETE_SESSION", session.tenant, session.key))

    async def purge(self) -> list[str]:
        """Nothing to do: each deletion removes every key, posting and vector at once."""
        return []

    async def delete_idle_sessions(self, older_than: float) -> int:
        deleted = 0
        while True:
            seen, gone = await self._run("DELETE_IDLE", repr(older_than), _SWEEP_BATCH)
            deleted += int(gone)
            if int(seen) < _SWEEP_BATCH:
                return deleted

    # -- Responses API ----------------------------------------------------------

    async def record_response(
        self,
        session: SessionRef,
        conversation: Sequence[Storable],
        output: Sequence[MessageIn],
        response: ResponseIn,
        request: RequestRecord,
    ) -> ExchangeResult:
        """Store one response atomically (one script; see ``Store.record_response``)."""
        now = time.time()
        created_at = request.created_at or now
        row = {
            "id": response.id,
            "tenant": session.tenant,
            "session_key": session.key,
            "previous_response_id": response.previous_response_id,
            "model": response.model,
            "status": response.status,
            "response": response.response,
            "created_at": created_at,
        }
        call = RecordCall(
            self._chains, self._ttl_ms, self._index, now, session, conversation, output, request,
            (response.id, orjson.dumps(row)[:-1]),
        )  # fmt: skip
        result: ExchangeResult = await self._call(call)
        return result

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None:
        data = await self._run("GET_RESPONSE", tenant, response_id)
        return None if data is None else StoredResponse(**orjson.loads(data))

    async def response_exists(self, response_id: str) -> bool:
        return bool(await self._run("RESPONSE_EXISTS", "", response_id))

    async def response_chain(self, tenant: str, response_id: str) -> list[StoredItem]:
        return codec.items(await self._run("RESPONSE_CHAIN", tenant, response_id, 1))

    async def response_input_items(self, tenant: str, response_id: str) -> list[StoredItem]:
        return codec.items(await self._run("RESPONSE_CHAIN", tenant, response_id, 2))

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        return bool(await self._run("DELETE_RESPONSE", tenant, response_id))

    # -- recall (proxy/store/redis_search.py) --------------------------------------

    async def search(
        self,
        session: SessionRef,
        words: Sequence[str],
        *,
        limit: int,
        before: str,
        constants: Sequence[float],
    ) -> list[bytes]:
        """The recall index's script (``constants``: proxy/store/bm25.py's SCRIPT_ARGS):
        {item id, position, score, content hash, ...}, best first."""
        # repr: the shortest text that reads back as the same double (Lua's tonumber too).
        numbers = [repr(c) for c in constants]
        args: list[str | bytes | int] = [session.tenant, session.key, limit, before, *numbers]
        return list(await self._run("SEARCH", *args, *words))

    # -- summaries ----------------------------------------------------------------

    async def save_summary(
        self, session: SessionRef, covered: Sequence[Storable], summary: SummaryIn
    ) -> StoredSummary:
        """Store a summary and the items it covers atomically (see ``Store.save_summary``)."""
        if not covered:
            raise ValueError("a summary must cover at least one item")
        now = time.time()
        content = [m.content_hash for m in covered]
        prefix = self._chains.prefix(session, content)
        known: Sequence[int] = prefix.known_ids if prefix.session_id is not None else ()
        fields = {
            "covers_path_hash": prefix.path_hashes[-1],
            "start_unit": summary.start_unit,
            "previous_summary_id": summary.previous_summary_id,
            "text": summary.text,
            "facts": [dict(f) for f in summary.facts],
            "flagged": list(summary.flagged),
            "model": summary.model,
            "prompt_hash": summary.prompt_hash,
            "usage": summary.usage,
            "created_at": now,
        }
        tail = orjson.dumps(fields)[1:]
        span = f"{prefix.path_hashes[-1]}:{summary.start_unit}"
        wanted: set[int] | None = None
        while True:
            spec = codec.Specs(known)
            out = await self._run(
                "SAVE_SUMMARY", session.tenant, session.key, repr(now), self._ttl_ms,
                str(prefix.session_id or ""), spec.parent, len(known), span, tail,
                spec(len(covered) - 1),
                *codec.quadruples(
                    covered, prefix.path_hashes, len(known), now, wanted, self._index
                ),
            )  # fmt: skip
            if out[0] == b"stale":
                self._chains.forget(session)
                known, wanted = (), None
                continue
            if out[0] == b"words":
                wanted = {int(n) for n in out[1:]}
                continue
            return StoredSummary(**orjson.loads(out[1]))

    async def summaries(self, session: SessionRef) -> list[StoredSummary]:
        found = [
            StoredSummary(**orjson.loads(data))
            for data in await self._run("SUMMARIES", session.tenant, session.key)
        ]
        found.sort(key=lambda s: s.id)
        return found

    async def summaries_for(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary]:
        return covering_summaries(await self.summaries(session), path_hashes, limit)

    def summaries_known(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary] | None:
        # Other instances write summaries too, and nothing tells this one: always read.
        return None


_WRITE_SCRIPTS = (
    "RECORD",
    "SAVE_SUMMARY",
    "DELETE_SESSION",
    "DELETE_IDLE",
    "DELETE_RESPONSE",
    "ADVANCE_FENCE",
)
_READ_SCRIPTS = (
    "HISTORY_SINCE",
    "GET_SESSION",
    "LIST_SESSIONS",
    "LIST_SESSIONS_MATCHING",
    "REQUESTS",
    "REQUEST",
    "GET_RESPONSE",
    "RESPONSE_CHAIN",
    "RESPONSE_EXISTS",
    "SUMMARIES",
    "SEARCH",
)


def _build(spec: StoreSpec) -> RedisStore:
    if spec.url is None:
        raise ValueError("the Redis store needs a store URL")
    return RedisStore(spec.url, prefix=f"{spec.key_prefix}:", ttl_s=spec.ttl_s, caches=spec.caches)


BACKEND: Backend[RedisStore] = Backend("redis", _build, RedisRecallIndex, RedisVectorIndex)
