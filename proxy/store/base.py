"""The Store protocol and the values that cross it.

A session's history is a tree of items (messages and replies). Each item is
identified within its session by a *path hash*: the hash of its parent's path
hash and its own content hash. A client resends its whole history on every
call; the same prefix yields the same path hashes, so each message is stored
once, and an edited or forked history simply grows a new branch. Nothing
stored is ever rewritten in place.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol


def path_hash(parent: str | None, content_hash: str) -> str:
    """Identity of an item within its session: its content and its ancestry."""
    h = hashlib.blake2b(digest_size=16)
    h.update((parent or "root").encode())
    h.update(b"/")
    h.update(content_hash.encode())
    return h.hexdigest()


@dataclass(frozen=True)
class CacheBudget:
    """One memory budget (config ``cache.max_bytes``) shared out among the in-memory caches.

    Each cache estimates the bytes it holds (its module says how) and evicts
    least recently used sessions past its share. The shares follow what a
    request reuses most: each session's messages (hashes, counts, keys: the
    bulk), the stored chain a ``history: server`` session replays, then
    token counts, chain ids, the stable-prefix keys and the memos of a
    request resent over an unchanged session (recall outcomes, summary plans,
    path hashes).
    """

    max_bytes: int = 2**30

    @property
    def messages(self) -> int:
        return self.max_bytes * 40 // 100

    @property
    def histories(self) -> int:
        return self.max_bytes * 32 // 100

    @property
    def counts(self) -> int:
        """For all encodings together. Small: the only cache keyed by content, not by
        session (the others keep at most 1,024 sessions), so the one that grows with
        the number of sessions served; a message the message cache or a chain holds
        carries its count already."""
        return self.max_bytes * 3 // 100

    @property
    def chains(self) -> int:
        return self.max_bytes * 10 // 100

    @property
    def prefixes(self) -> int:
        return self.max_bytes * 5 // 100

    @property
    def recall_memo(self) -> int:
        return self.max_bytes * 3 // 100

    @property
    def plan_memo(self) -> int:
        return self.max_bytes * 3 // 100

    @property
    def path_hashes(self) -> int:
        return self.max_bytes * 4 // 100


@dataclass(frozen=True)
class SessionRef:
    """A session as the client names it, scoped by tenant (hash of its API key)."""

    tenant: str
    key: str


class Storable(Protocol):
    """What a store reads of a conversation's message to record it: a
    :class:`MessageIn`, or a :class:`StoredItem` (a ``history: server`` chain is
    recorded as the items it is; nothing is copied for it)."""

    @property
    def message(self) -> dict[str, Any]: ...

    @property
    def content_hash(self) -> str: ...

    @property
    def role(self) -> str: ...

    @property
    def token_count(self) -> int | None: ...

    @property
    def status(self) -> str: ...


# MessageIn and StoredItem have slots: the caches hold one per message of every
# session they keep, and a __dict__ made each ~300 bytes larger. They are not
# frozen, though nothing assigns their fields once made (they are shared by the
# caches and every request that reads them: never assign one): a frozen
# dataclass's __init__ sets each field through object.__setattr__, 1.06 against
# 0.20 us for ten fields, and a chain read or a history resent afresh makes one
# per message (2,000 a request). Hashing is lost with nothing: their message is
# a dict, so a frozen one could not be hashed either.
@dataclass(slots=True)
class MessageIn:
    """A message (or reply) to store: the raw JSON plus its queryable columns."""

    message: dict[str, Any]
    content_hash: str
    role: str
    token_count: int | None = None
    # "complete", or "incomplete" for a reply cut short (client went away).
    status: str = "complete"


@dataclass(slots=True)  # not frozen: see MessageIn
class StoredItem:
    id: int
    session_id: int
    parent_id: int | None
    path_hash: str
    content_hash: str
    role: str
    token_count: int | None
    message: dict[str, Any]
    status: str
    created_at: float


@dataclass
class RequestRecord:
    """One row per proxied request: what was forwarded and what came back."""

    id: str
    tenant: str
    route: str
    policy: str
    model: str | None
    stream: bool
    status: int
    upstream_status: int | None = None
    session_key: str | None = None
    endpoint: str = "/v1/chat/completions"
    mode: str | None = None
    messages_before: int = 0
    messages_after: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    turns_dropped: int = 0
    messages_dropped: int = 0
    # Positions (in the conversation as received) the policy dropped; the store
    # translates them to stored item ids in ``dropped_item_ids``.
    dropped_indexes: list[int] = field(default_factory=list)
    reason: str | None = None
    error: str | None = None
    incomplete: bool = False
    upstream_ms: float | None = None
    total_ms: float | None = None
    usage: dict[str, Any] | None = None
    # Everything else worth keeping (decision details, clips, repairs...).
    detail: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    # The upstream's own prompt-cache figures (proxy.telemetry.cache_usage); None: not reported.
    upstream_prompt_tokens: int | None = None
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None
    # Leading forwarded messages identical to the session's previous forwarded list.
    stable_prefix: int | None = None


@dataclass(frozen=True)
class ExchangeResult:
    session_id: int
    # Stored item id for each message of the conversation, in order.
    item_ids: list[int]
    reply_id: int | None
    # How many of the conversation's messages were new to the store.
    new_messages: int
    # A response's output items' ids, in order (``record_response``; the last is
    # ``reply_id``): what the background embedder needs to find them.
    output_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class SessionInfo:
    id: int
    tenant: str
    key: str
    created_at: float
    updated_at: float
    head_item_id: int | None
    item_count: int
    request_count: int
    stored_tokens: int


@dataclass(frozen=True)
class ResponseIn:
    """A Responses API response to file under its session (see ``Store.record_response``)."""

    id: str
    # The response object as the client received it.
    response: dict[str, Any]
    status: str
    model: str | None = None
    previous_response_id: str | None = None


@dataclass(frozen=True)
class StoredResponse:
    id: str
    tenant: str
    session_id: int
    session_key: str
    # The chain's end (its last output item) and the last item it was given.
    head_item_id: int | None
    input_head_item_id: int | None
    previous_response_id: str | None
    model: str | None
    status: str
    response: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class SummaryIn:
    """A summary to store (see ``Store.save_summary``)."""

    text: str
    # Leading turns the summary does not cover (kept verbatim before it).
    start_unit: int = 0
    # Pinned facts as ``{"kind": ..., "value": ...}``; entities flagged as unsupported.
    facts: tuple[dict[str, str], ...] = ()
    flagged: tuple[str, ...] = ()
    model: str | None = None
    prompt_hash: str | None = None
    usage: dict[str, Any] | None = None
    previous_summary_id: int | None = None


@dataclass(frozen=True)
class StoredSummary:
    id: int
    session_id: int
    # The last stored item the summary covers, and its path hash.
    covers_item_id: int
    covers_path_hash: str
    start_unit: int
    previous_summary_id: int | None
    text: str
    facts: list[dict[str, str]]
    flagged: list[str]
    model: str | None
    prompt_hash: str | None
    usage: dict[str, Any] | None
    created_at: float


class FencedOut(RuntimeError):
    """A write under a session lock that was lost: a newer holder has written since.

    The shared stores (PostgreSQL, Redis) raise it for an exchange whose
    ``detail["fence"]`` token is older than one the session stored; nothing is written.
    """


class Store(Protocol):
    # Its backend's name (proxy/store/registry.py builds its indexes from it).
    backend: ClassVar[str]

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def record_exchange(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> ExchangeResult | None:
        """Store one exchange atomically (one transaction).

        With a session: create it if new; append the messages of
        ``conversation`` not stored yet (matched by path hash, so a resent
        prefix is not duplicated); append ``reply`` as the child of the last
        message; make the reply (or the last message) the session's head; write
        ``request`` with the session id and ``dropped_item_ids``. Without a
        session, or with ``conversation`` empty and no reply (a failed
        upstream call), only the request row is written. Returns None when
        there is no session.
        """
        ...

    def record_exchange_soon(
        self,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        reply: MessageIn | None,
        request: RequestRecord,
    ) -> asyncio.Future[ExchangeResult | None]:
        """``record_exchange``, started now; the future resolves once it is stored.

        The request path uses this after the answer is relayed: a backend may
        queue the write without a task or coroutine per exchange.
        """
        ...

    async def history(self, session: SessionRef, *, shared: bool = False) -> list[StoredItem]:
        """The chain from the root to the session's head, oldest first.

        The items are the caller's to change, unless ``shared``: then they may
        be the store's own cached objects (the request path only reads them),
        and must not be changed.
        """
        ...

    async def get_session(self, session: SessionRef) -> SessionInfo | None: ...

    async def list_sessions(
        self,
        tenant: str | None = None,
        limit: int = 50,
        offset: int = 0,
        key_contains: str | None = None,
    ) -> list[SessionInfo]:
        """Newest activity first; ``key_contains``: only sessions whose key contains it
        (case-sensitive), in any tenant unless ``tenant`` is given too."""
        ...

    async def requests(self, session: SessionRef) -> list[dict[str, Any]]:
        """The session's request rows, oldest first, as plain dicts."""
        ...

    async def request(self, request_id: str) -> dict[str, Any] | None: ...

    async def delete_session(self, session: SessionRef) -> bool:
        """Delete the session and every row that belongs to it."""
        ...

    async def delete_idle_sessions(self, older_than: float) -> int:
        """Delete sessions last updated before ``older_than`` (TTL expiry); return how many."""
        ...

    async def purge(self) -> list[str]:
        """Remove what deletions left on disk that the deletions themselves could not
        (PostgreSQL's dead tuples and freed page space); return the steps taken.
        ``ctxproxy sessions purge`` runs it; docs/operations/deletion.md says what each
        backend keeps."""
        ...

    # -- Responses API ----------------------------------------------------------

    async def record_response(
        self,
        session: SessionRef,
        conversation: Sequence[Storable],
        output: Sequence[MessageIn],
        response: ResponseIn,
        request: RequestRecord,
    ) -> ExchangeResult:
        """Store one response atomically (one transaction).

        ``conversation`` is every item the response was given, oldest first
        (the stored chain it continues, then its new input); ``output`` its
        output items. Both are stored as items of the session, as
        ``record_exchange`` stores messages (a known prefix is not duplicated),
        ``output`` chained after ``conversation``; the session's head moves to
        the chain's end. The response row maps ``response.id`` (per tenant) to
        the session and the chain's two ends; a response id stored before is
        remapped (latest wins). ``request`` is written as by
        ``record_exchange``, ``reply_id`` being the last output item.
        """
        ...

    async def get_response(self, tenant: str, response_id: str) -> StoredResponse | None: ...

    async def response_exists(self, response_id: str) -> bool:
        """Whether any tenant has a response with this id (so others are refused, not proxied)."""
        ...

    async def response_chain(self, tenant: str, response_id: str) -> list[StoredItem]:
        """Every item from the root to the response's last output item, oldest first."""
        ...

    async def response_input_items(self, tenant: str, response_id: str) -> list[StoredItem]:
        """Every item the response was given (root to its input head), oldest first."""
        ...

    async def delete_response(self, tenant: str, response_id: str) -> bool:
        """Forget the response id and delete what only it holds, atomically.

        What goes (proxy/store/pruning.py): its mapping; its own request rows;
        the items of its chain nothing else reaches (later responses, request
        rows, a branch), with their recall index entries; summaries covering
        any of them; the session, if left with no items and no request rows.
        """
        ...

    # -- summaries ----------------------------------------------------------------

    async def save_summary(
        self, session: SessionRef, covered: Sequence[Storable], summary: SummaryIn
    ) -> StoredSummary:
        """Store a summary of the chain ``covered`` (root first), atomically.

        Items of ``covered`` not stored yet are stored, as ``record_exchange``
        stores them (the session is created if new; its head and
        ``updated_at`` do not move). The summary covers up to the last of
        them. One summary per range (session, covered item, ``start_unit``):
        when one is stored already, it is returned and ``summary`` is not
        stored (the first writer wins). ``covered`` must not be empty.
        """
        ...

    async def summaries(self, session: SessionRef) -> list[StoredSummary]:
        """The session's summaries, oldest first."""
        ...

    async def summaries_for(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary]:
        """Summaries covering a prefix of the chain ``path_hashes`` (root first).

        Longest prefix first (newest first among equals); at most ``limit``.
        """
        ...

    def summaries_known(
        self, session: SessionRef, path_hashes: Sequence[str], limit: int = 4
    ) -> list[StoredSummary] | None:
        """What ``summaries_for`` would answer, when the process holds it exactly, with no
        I/O (a memo of the session's summaries); None when only a read can tell.

        A request path that needs no summary asks this first and reads nothing.
        """
        ...


def chain_path_hashes(content_hashes: Sequence[str]) -> list[str]:
    """Path hashes of a chain from the root: each item's identity given its ancestry."""
    out: list[str] = []
    parent: str | None = None
    for content_hash in content_hashes:
        parent = path_hash(parent, content_hash)
        out.append(parent)
    return out


def chain_identity(chain: Sequence[Storable], session_id: int) -> tuple[list[str], list[int]]:
    """The path hashes of ``chain``, and the ids of its leading items stored in the session.

    A replayed chain (a ``previous_response_id``'s) starts with the session's
    own stored items, root first, each the child of the one before: their path
    hashes and ids are theirs, nothing to hash or look up; the rest are hashed
    on from the last of them.
    """
    paths: list[str] = []
    ids: list[int] = []
    parent: int | None = None
    for item in chain:
        if type(item) is not StoredItem or item.session_id != session_id:
            break
        if item.parent_id != parent:
            break
        paths.append(item.path_hash)
        ids.append(item.id)
        parent = item.id
    last = paths[-1] if paths else None
    for item in chain[len(paths) :]:
        last = path_hash(last, item.content_hash)
        paths.append(last)
    return paths, ids


def dropped_item_ids(record: RequestRecord, item_ids: Sequence[int]) -> list[int]:
    """Rows no longer store these (see :func:`spans`): always empty for a new row.

    Kept so every backend writes the legacy column the same; a row's dropped
    items are its chain's items at its ``dropped_spans`` positions.
    """
    return []


def spans(positions: Iterable[int]) -> list[list[int]]:
    """Positions as sorted, merged half-open ranges: ``[1, 2, 3, 7]`` -> ``[[1, 4], [7, 8]]``.

    A policy drops the oldest turns in one or two runs, so a request row's
    size does not grow with the session's length.
    """
    ordered = sorted(set(positions))
    if ordered and ordered[-1] - ordered[0] == len(ordered) - 1:
        # One run (the usual trim: the oldest turns): no walk over thousands of them.
        return [[ordered[0], ordered[-1] + 1]]
    out: list[list[int]] = []
    for p in ordered:
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


def positions(ranges: Iterable[Sequence[int]]) -> list[int]:
    """The positions of half-open ``ranges`` (:func:`spans` undone), ascending."""
    return [p for start, end in ranges for p in range(start, end)]


def row_spans(value: Any) -> list[list[int]]:
    """A stored row's dropped positions as spans, whichever shape it was written in.

    Rows written before spans hold a list of positions; later ones a list of
    ``[from, to]`` pairs (half-open).
    """
    if not value:
        return []
    if all(isinstance(v, int) for v in value):
        return spans(value)
    return [[int(a), int(b)] for a, b in value]


def normalize_request(row: dict[str, Any]) -> dict[str, Any]:
    """A request row as every store returns it, whatever shape it was stored in.

    ``dropped_spans``: the positions (in the conversation as received) the
    policy dropped, as half-open ranges. The legacy ``dropped_indexes`` and
    ``dropped_item_ids`` are read (an old row's list of positions becomes
    spans) and not returned: a dropped item's id is its request chain's item
    at that position.
    """
    row["dropped_spans"] = row_spans(row.pop("dropped_indexes", None))
    row.pop("dropped_item_ids", None)
    return row


def request_row(
    record: RequestRecord,
    *,
    session_id: int | None,
    tenant: str,
    session_key: str | None,
    dropped_item_ids: list[int],
    first_item_id: int | None,
    last_item_id: int | None,
    reply_item_id: int | None,
    created_at: float,
) -> dict[str, Any]:
    """The shape of a stored request row, shared by every backend so they agree exactly."""
    return {
        "id": record.id,
        "session_id": session_id,
        "tenant": tenant,
        "session_key": session_key,
        "endpoint": record.endpoint,
        "route": record.route,
        "policy": record.policy,
        "mode": record.mode,
        "model": record.model,
        "stream": record.stream,
        "status": record.status,
        "upstream_status": record.upstream_status,
        "messages_before": record.messages_before,
        "messages_after": record.messages_after,
        "tokens_before": record.tokens_before,
        "tokens_after": record.tokens_after,
        "turns_dropped": record.turns_dropped,
        "messages_dropped": record.messages_dropped,
        # Spans, not lists: a row's size does not grow with the session (see ``spans``).
        "dropped_indexes": spans(record.dropped_indexes),
        "dropped_item_ids": dropped_item_ids,
        "reason": record.reason,
        "error": record.error,
        "incomplete": record.incomplete,
        "upstream_ms": record.upstream_ms,
        "total_ms": record.total_ms,
        "usage": record.usage,
        "detail": record.detail,
        "first_item_id": first_item_id,
        "last_item_id": last_item_id,
        "reply_item_id": reply_item_id,
        "created_at": created_at,
        "upstream_prompt_tokens": record.upstream_prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "cache_write_tokens": record.cache_write_tokens,
        "stable_prefix": record.stable_prefix,
    }
