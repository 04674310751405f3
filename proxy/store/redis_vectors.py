"""The Redis vector index: a list per session, appended by one script per write.

``P v:S`` holds the session's vectors in the order written (each entry
``item id:position:content hash:vector bytes``) and ``P y:S`` the item ids
that have one, so an item keeps its first vector. Both are session keys
(proxy/store/redis_scripts.py's SESSION_KEYS): deleted with the session,
expiring with it (a write takes the session's remaining TTL). The cursor is
the list's length: Redis runs one script at a time, so entries appear in
list order and ``LRANGE`` from the cursor returns exactly what is new. An item
pruned later (a deleted response's) keeps its entry, skipped on reading.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from proxy.store.base import SessionRef
from proxy.store.redis_scripts import PRELUDE
from proxy.store.vectors import ItemVector, StoredVectors

# ARGV: 1 prefix, 2 tenant, 3 key, then (item id, position, vector) triples.
# Items not of the session, and items with a vector already, are skipped.
PUT_VECTORS = (
    "#!lua\n"
    + PRELUDE
    + r"""
local name = nm(ARGV[2], ARGV[3])
local sid = live_sid(name)
if not sid then return 0 end
local added = 0
for i = 4, #ARGV, 3 do
  local id, position, vector = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local item = redis.call('HGET', P .. 'i:' .. sid, id)
  if item and redis.call('SADD', P .. 'y:' .. sid, id) == 1 then
    local hash = cjson.decode(item)[2]
    redis.call('RPUSH', P .. 'v:' .. sid, id .. ':' .. position .. ':' .. hash .. ':' .. vector)
    added = added + 1
  end
end
if added > 0 then adopt_ttl(sid, name) end
return added
"""
)

# ARGV: 1 prefix, 2 tenant, 3 key, 4 cursor (entries already read).
# Returns {} for no session, else {session id, entries read, entry, ...} from the
# cursor on (entries of items that no longer exist left out).
VECTORS = (
    "#!lua flags=no-writes\n"
    + PRELUDE
    + r"""
local sid = live_sid(nm(ARGV[2], ARGV[3]))
if not sid then return {} end
local out = {sid}
local entries = redis.call('LRANGE', P .. 'v:' .. sid, tonumber(ARGV[4]), -1)
out[2] = tostring(#entries)
for _, entry in ipairs(entries) do
  -- An item pruned since (a deleted response's) takes its vector with it; the
  -- entry stays so that cursors stay positions in the list.
  if redis.call('HEXISTS', P .. 'i:' .. sid, string.match(entry, '^(%d+):')) == 1 then
    out[#out + 1] = entry
  end
end
return out
"""
)


class _Client(Protocol):
    def register_script(self, script: str) -> Any: ...


class _RedisStore(Protocol):
    """What the index needs of a RedisStore: its client and key prefix."""

    prefix: str

    @property
    def client(self) -> _Client: ...


def parse(entry: bytes) -> ItemVector:
    item_id, position, content_hash, vector = entry.split(b":", 3)
    return ItemVector(int(item_id), int(position), content_hash.decode(), vector)


class RedisVectorIndex:
    """:class:`~proxy.store.vectors.VectorIndex` of a RedisStore."""

    def __init__(self, store: _RedisStore) -> None:
        self._store = store
        # Registered on the store's client of the moment (a reopened store has a new one).
        self._scripts: dict[tuple[str, int], Any] = {}

    def _script(self, name: str, source: str) -> Any:
        client = self._store.client
        key = (name, id(client))
        if key not in self._scripts:
            self._scripts[key] = client.register_script(source)
        return self._scripts[key]

    async def put_vectors(self, session: SessionRef, vectors: Sequence[ItemVector]) -> None:
        if not vectors:
            return
        args: list[Any] = [self._store.prefix, session.tenant, session.key]
        for v in vectors:
            args += [v.item_id, v.position, v.vector]
        await self._script("PUT_VECTORS", PUT_VECTORS)(args=args)

    async def vectors(self, session: SessionRef, *, after: int = 0) -> StoredVectors:
        script = self._script("VECTORS", VECTORS)
        out = await script(args=[self._store.prefix, session.tenant, session.key, after])
        if not out:
            return StoredVectors(None, [], after)
        rows = [parse(e) for e in out[2:]]
        return StoredVectors(int(out[0]), rows, after + int(out[1]))
