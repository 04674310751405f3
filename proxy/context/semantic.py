"""Semantic search on the request path: a session's vectors in memory, cosine, top k.

:class:`SessionVectors` holds one session's stored vectors as a float32
matrix (one unit row per item), with each row's position, item id and content
hash. :class:`VectorCache` keeps them for the sessions searched lately: a
request asks the store only for the vectors stored since its cursor
(proxy/store/vectors.py), usually none, so a 5,000-turn session is loaded once,
not on every request. The cache is bounded by rows (least recently searched
sessions go first); a session deleted, or deleted and made again (a new store
id), starts over.

A search is one matrix-vector product over the session's rows (256
dimensions: about 0.3 ms for 5,000 rows) and a partial sort for the best ``k``
whose position is below ``before``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from proxy.context.embedder import Vectors, from_bytes
from proxy.store.base import SessionRef
from proxy.store.vectors import ItemVector, VectorIndex

# Rows kept across all sessions: 256 float32 dimensions make 1 KiB a row, so 64 MiB.
MAX_ROWS = 65_536


@dataclass(frozen=True)
class Near:
    """A stored item close to the query."""

    item_id: int
    position: int
    content_hash: str
    # Cosine similarity, in [-1, 1].
    score: float


@dataclass
class SessionVectors:
    session_id: int
    dim: int
    cursor: int = 0
    count: int = 0
    matrix: Vectors = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    positions: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    item_ids: list[int] = field(default_factory=list)
    hashes: list[str] = field(default_factory=list)
    ids: set[int] = field(default_factory=set)

    def extend(self, rows: list[ItemVector]) -> None:
        vectors, kept = [], []
        for row in rows:
            vector = from_bytes(row.vector, self.dim)
            if vector is not None and row.item_id not in self.ids:
                vectors.append(vector)
                kept.append(row)
        if not kept:
            return
        need = self.count + len(kept)
        if need > len(self.matrix):
            # Grow by doubling: appending an exchange's vectors copies nothing most times.
            capacity = max(need, 2 * len(self.matrix), 64)
            matrix = np.zeros((capacity, self.dim), dtype=np.float32)
            positions = np.zeros(capacity, dtype=np.int64)
            if self.count:
                matrix[: self.count] = self.matrix[: self.count]
                positions[: self.count] = self.positions[: self.count]
            self.matrix, self.positions = matrix, positions
        self.matrix[self.count : need] = np.stack(vectors)
        self.positions[self.count : need] = [r.position for r in kept]
        for row in kept:
            self.item_ids.append(row.item_id)
            self.hashes.append(row.content_hash)
            self.ids.add(row.item_id)
        self.count = need

    def nearest(self, query: Vectors, k: int, before: int | None = None) -> list[Near]:
        """The ``k`` rows most similar to ``query`` (a unit vector), best first."""
        if self.count == 0 or k <= 0:
            return []
        scores = self.matrix[: self.count] @ query
        if before is not None:
            scores = np.where(self.positions[: self.count] < before, scores, -np.inf)
        k = min(k, self.count)
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [
            Near(self.item_ids[i], int(self.positions[i]), self.hashes[i], float(scores[i]))
            for i in top
            if np.isfinite(scores[i])
        ]


class VectorCache:
    """Sessions' vectors, loaded by cursor and kept (bounded) between requests."""

    def __init__(self, index: VectorIndex, dim: int, max_rows: int = MAX_ROWS) -> None:
        self._index = index
        self._dim = dim
        self._max_rows = max_rows
        self._sessions: OrderedDict[SessionRef, SessionVectors] = OrderedDict()
        self._rows = 0

    @property
    def rows(self) -> int:
        return self._rows

    def peek(self, ref: SessionRef) -> SessionVectors | None:
        """The session's vectors as cached (no store read); None when not cached."""
        return self._sessions.get(ref)

    async def get(self, ref: SessionRef) -> SessionVectors | None:
        """The session's vectors, brought up to date; None when there is no such session."""
        entry = self._sessions.get(ref)
        after = entry.cursor if entry is not None else 0
        stored = await self._index.vectors(ref, after=after)
        entry = self._sessions.get(ref)  # another request may have updated it meanwhile
        if stored.session_id is None:
            self._drop(ref)
            return None
        if entry is not None and entry.session_id != stored.session_id:
            self._drop(ref)
            entry = None
        if entry is None:
            if after:  # the rows before the cursor belonged to a session deleted since
                stored = await self._index.vectors(ref)
            if stored.session_id is None:
                return None
            entry = SessionVectors(stored.session_id, self._dim)
            self._sessions[ref] = entry
        if stored.cursor > entry.cursor:
            before = entry.count
            entry.extend(stored.rows)
            entry.cursor = stored.cursor
            self._rows += entry.count - before
        self._sessions.move_to_end(ref)
        self._evict(keep=ref)
        return entry

    def _drop(self, ref: SessionRef) -> None:
        entry = self._sessions.pop(ref, None)
        if entry is not None:
            self._rows -= entry.count

    def _evict(self, keep: SessionRef) -> None:
        while self._rows > self._max_rows and len(self._sessions) > 1:
            oldest = next(iter(self._sessions))
            if oldest == keep:
                break
            self._drop(oldest)

    def forget(self, ref: SessionRef) -> None:
        self._drop(ref)
