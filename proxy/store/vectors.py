"""The vector index seam: each stored item's embedding, for semantic recall.

Beside the lexical recall index (proxy/store/search.py), every backend keeps
each item's embedding vector: SQLite and PostgreSQL a table (``item_vectors``),
Redis a list per session, the in-memory fake a list
(proxy/store/*_vectors.py; one contract test, tests/store/test_vectors_contract.py).
Vectors are written in the background after their items are stored
(proxy/context/embeddings.py) and read back by a cursor, so a long session's
vectors are loaded once and then only what is new (proxy/context/semantic.py).
They are opaque bytes here (float16 at the embedder's dimension): the index
neither reads nor compares them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.store.base import SessionRef


@dataclass(frozen=True)
class ItemVector:
    """One stored item's embedding: the item, where it sits in its chain, its vector."""

    item_id: int
    # Its depth from the root: its index in any conversation that resends its chain.
    position: int
    # So the caller can check that the message at ``position`` of its own list is this one.
    content_hash: str
    # The embedding as bytes (little-endian float16); stored as given.
    vector: bytes


@dataclass(frozen=True)
class StoredVectors:
    """A session's vectors stored after a cursor, in the order they were stored."""

    # The session's store id; None when there is no such session. A session
    # deleted and made again has a new id (no backend reuses one), so a cache
    # of the old one's vectors knows to start over.
    session_id: int | None
    rows: list[ItemVector]
    # Pass as ``after`` next time: only vectors stored since come back.
    cursor: int


class VectorIndex(Protocol):
    """What semantic recall needs from storage. The contract every backend keeps:

    - **Writing.** ``put_vectors`` stores each item's vector under the
      session, once (an item that has one keeps it); an unknown session, or
      an item id that is not the session's, is ignored, never an error.
    - **Reading.** ``vectors`` returns the session's vectors stored after
      ``after`` (a cursor from an earlier call; 0: from the start), oldest
      first, with the cursor to pass next: a vector stored after a call that
      returned cursor ``c`` comes back from ``vectors(after=c)``, and none
      comes back twice. Work is proportional to what comes back.
    - **Scope.** As the recall index's: only the session's own (tenant and
      key); deleted with the session, expired with it.
    - Errors raise (the caller serves the request without semantic recall).
    """

    async def put_vectors(self, session: SessionRef, vectors: Sequence[ItemVector]) -> None: ...

    async def vectors(self, session: SessionRef, *, after: int = 0) -> StoredVectors: ...
