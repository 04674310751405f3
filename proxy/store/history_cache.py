"""What every store's cache of each session's chain shares (SQLite, PostgreSQL, Redis).

Each store checks the chain it holds against its own state in one read (the
head, or PostgreSQL's version) and reads only what is new; that read is the
store's (proxy/store/sqlite_history.py, postgres_history.py,
redis_history.py). The bookkeeping is here, once: entries bounded by
sessions and by bytes with admission (proxy/store/sized.py), a chain either
extended by the items after its head or replaced, and items served shared
to a caller that only reads them, copied to any other.
"""

from __future__ import annotations

from typing import NamedTuple

from proxy.store.base import SessionRef, StoredItem
from proxy.store.rows import copied
from proxy.store.sized import SizedCache, SizedLRU

# What an item costs held, besides its message's JSON length (the dict and its
# strings are about the JSON's size; the StoredItem, its two hash strings, its
# numbers): ~596 bytes measured with tracemalloc on CPython 3.11 (~697 before
# StoredItem had slots and role and status were interned).
ITEM_BYTES = 600


class Held(NamedTuple):
    """A session's chain as cached."""

    session_id: int
    head: int
    items: tuple[StoredItem, ...]
    size: int
    # PostgreSQL's session version when read (the other stores check the head).
    version: int = 0


class HistoryCache(SizedCache[tuple[str, str], Held]):
    """Bounded by sessions and by the bytes held (JSON length plus ITEM_BYTES an item)."""

    def __init__(self, max_sessions: int = 1024, max_bytes: int = 64 * 2**20) -> None:
        self._entries: SizedLRU[tuple[str, str], Held] = SizedLRU(
            max_sessions, max_bytes, admission=True
        )

    def held(self, session: SessionRef) -> Held | None:
        return self._entries.get((session.tenant, session.key))

    def current(self, session: SessionRef, held: Held, *, shared: bool) -> list[StoredItem]:
        """``held`` is current (the store said so): served as it is."""
        self._entries.touch((session.tenant, session.key))
        return served(held, shared)

    def keep(
        self,
        session: SessionRef,
        read: Held,
        extends: Held | None,
        *,
        shared: bool,
    ) -> list[StoredItem]:
        """``read`` (what the store read now, its ``size`` the JSON's bytes) appended to
        ``extends`` (the chain it continues) or, with None, as the whole chain."""
        added = read.size + ITEM_BYTES * len(read.items)
        if extends is not None:
            read = read._replace(items=extends.items + read.items, size=extends.size + added)
        else:
            read = read._replace(size=added)
        self._entries.put((session.tenant, session.key), read, read.size)
        return served(read, shared)

    def forget(self, session: SessionRef) -> None:
        self._entries.drop((session.tenant, session.key))


def served(held: Held, shared: bool) -> list[StoredItem]:
    """The items themselves for a caller that only reads them, else its own copies."""
    return list(held.items) if shared else copied(held.items)
