"""The last chain a store committed per session: a resent history is neither hashed nor looked up.

A client resends its whole history on every call. Storing it again meant
computing a path hash per item and looking every one up in SQLite, work
proportional to the history on every request. This cache keeps, per
session, the content hashes, path hashes and item ids of the last chain
the store committed, so the next exchange computes path hashes and looks
up ids only for the items after the resent prefix.

Why cached ids stay valid: a session's ids are never reused (AUTOINCREMENT)
and items are deleted only with their whole session or by a response's
DELETE (proxy/store/pruning.py), which keeps every item a request row ends
at: a chat chain is cached only from a committed exchange, whose row ends at
its last item, so every item of it exists for as long as its session keeps
its id. (The Redis store caches response chains too; its write script checks
that the cached chain's last item still exists.) The write
job compares the session id it upserts with the cached one and ignores the
cache when they differ (the session was deleted and made again). The cache
is filled only with what a committed job returned, never with what a job
is about to write.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from proxy.store.base import SessionRef, path_hash
from proxy.store.sized import SizedCache, SizedLRU


class Chain(NamedTuple):
    session_id: int
    content_hashes: tuple[str, ...]
    path_hashes: tuple[str, ...]
    item_ids: tuple[int, ...]


class Prefix(NamedTuple):
    """What the cache knows of a chain about to be stored."""

    # Path hashes of the whole chain (the resent prefix's from the cache).
    path_hashes: list[str]
    # Item ids of the chain's first items (the resent prefix), valid if the
    # session's id is still ``session_id``.
    known_ids: tuple[int, ...]
    session_id: int | None


# What one item of a cached chain holds (its path hash string, an int id,
# three tuple slots; the content hash is the MessageIn's own string).
ITEM_BYTES = 160


class ChainCache(SizedCache[tuple[str, str], Chain]):
    """Bounded by sessions and by the bytes held (ITEM_BYTES an item); with admission, so a
    loop over more sessions than fit keeps hitting on a share of them (proxy/store/sized.py)."""

    def __init__(self, max_sessions: int = 1024, max_bytes: int = 16 * 2**20) -> None:
        # Keyed by (tenant, key): a plain tuple hashes in C, a SessionRef in Python.
        self._entries: SizedLRU[tuple[str, str], Chain] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )

    def get(self, session: SessionRef) -> Chain | None:
        return self._entries.peek((session.tenant, session.key))

    def prefix(self, session: SessionRef, content_hashes: Sequence[str]) -> Prefix:
        chain = self._entries.get((session.tenant, session.key))
        if chain is None:
            return Prefix(_extend([], content_hashes), (), None)
        known = chain.content_hashes
        if tuple(content_hashes[: len(known)]) == known:  # the whole chain resent: one C compare
            shared = len(known)
        else:
            shared = 0
            for new, old in zip(content_hashes, known, strict=False):
                if new != old:
                    break
                shared += 1
        paths = _extend(list(chain.path_hashes[:shared]), content_hashes[shared:])
        return Prefix(paths, chain.item_ids[:shared], chain.session_id)

    def committed(
        self,
        session: SessionRef,
        session_id: int,
        content_hashes: Sequence[str],
        path_hashes: Sequence[str],
        item_ids: Sequence[int],
    ) -> None:
        """Remember a chain a committed job stored (its ids as the job returned them)."""
        key = (session.tenant, session.key)
        if not item_ids:
            self._entries.drop(key)
            return
        held = self._entries.peek(key)
        if (
            held is not None
            and held.session_id == session_id
            and held.item_ids == tuple(item_ids)
            and held.content_hashes == tuple(content_hashes)
        ):
            # The same chain again (a history resent as it was, the same reply): held
            # already, its path hashes too (they follow from the content hashes).
            self._entries.touch(key)
            return
        chain = Chain(session_id, tuple(content_hashes), tuple(path_hashes), tuple(item_ids))
        self._entries.put(key, chain, len(item_ids) * ITEM_BYTES)

    def forget(self, session: SessionRef) -> None:
        self._entries.drop((session.tenant, session.key))


def _extend(paths: list[str], content_hashes: Sequence[str]) -> list[str]:
    """``paths`` (a chain's path hashes so far) extended by the items of ``content_hashes``."""
    parent = paths[-1] if paths else None
    for content_hash in content_hashes:
        parent = path_hash(parent, content_hash)
        paths.append(parent)
    return paths
