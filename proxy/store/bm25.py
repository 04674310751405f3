"""Okapi BM25 over each query term's matching items, ranked in the proxy.

The recall indexes of SQLite (proxy/store/sqlite_search.py) and PostgreSQL
(proxy/store/postgres_search.py) ask their database only for what an index
answers without reading rows: the session's id, what was stored in it since
this process last counted (items and their tokens, ids only grow), and the
ids of the session's items holding each term. The rest happens here:

1. each term's document frequency is its count; a term found in most of a
   long session (:func:`informative`) weighs nearly nothing and would bring
   thousands of ids: it is left out, and remembered as common for the
   session so later searches do not fetch it;
2. Okapi BM25 (k1 1.2, b 0.75) with each term counted once per item (chat
   messages are short), first without length, to pick the candidates;
3. the best candidates' positions, token counts and content hashes (a batch
   at a time while ``before`` leaves too few; cached: they never change),
   then the length normalisation with the item's stored token count, and
   the order.

A session's totals are kept per process: a session deleted and made again
has a new id and is counted afresh; items deleted one by one (a deleted
response) leave them a little high until the process restarts (they only
weigh the terms). Work is proportional to the matching items and to what
was stored since the last search, not to the session.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit

# A term in more of the session's items than this (and than COMMON_MIN) is
# left out when rarer terms are there: its BM25 weight is near nothing, but
# ranking every item it matches is most of a query's time (bench/recall.py).
COMMON_SHARE = 0.05
COMMON_MIN = 50

K1 = 1.2
B = 0.75

# Sessions whose statistics are kept (least recently searched go first), and
# terms per session.
SESSIONS = 256
TERMS = 4096


def informative(terms: Sequence[str], counts: Sequence[int], items: int) -> list[str]:
    """The terms worth ranking by: found in the session, and not in most of it."""
    found = [(n, t) for t, n in zip(terms, counts, strict=True) if n > 0]
    cap = max(COMMON_MIN, COMMON_SHARE * items)
    rare = [t for n, t in found if n <= cap]
    if rare:
        return rare
    return [t for _, t in sorted(found)[:2]]


@dataclass
class _Stats:
    """A session's index totals as counted up to a rowid, and its common terms.

    Updates are values computed from what a search read plus what it counted
    since, kept only when fresher than what is there: concurrent searches of
    one session never count a row twice.
    """

    session_id: int
    # (items, their tokens, counted up to this rowid)
    totals: tuple[int, int, int] = (0, 0, 0)
    # Terms found in more than the cap of items (most recent last), with that count.
    common: OrderedDict[str, int] = field(default_factory=OrderedDict)


# Candidates whose details are fetched at a time, per hit asked for (more than
# one: ``before`` excludes the kept window's items, which match too).
BATCH = 1.5
# Items' details kept (position, token count, content hash: never change).
DETAILS = 50_000


# Far above any chain's length: "no ``before``".
_NO_LIMIT = 1 << 62


def _rough(
    chosen: Sequence[str], idf: dict[str, float], matches: dict[str, list[int]]
) -> dict[int, float]:
    """Each matching item's BM25 score without length: its terms' weights summed,
    in the order of ``chosen`` (so the same floats whichever way it is computed)."""
    first, *others = chosen
    rough = dict.fromkeys(matches[first], idf[first])  # 0.0 + w is w
    get = rough.get
    for t in others:
        weight = idf[t]
        for rowid in matches[t]:
            rough[rowid] = get(rowid, 0.0) + weight
    return rough


class Bm25Index:
    """A :class:`~proxy.store.search.RecallIndex` ranking in the proxy; a backend
    gives it its two statements (:meth:`_matches`, :meth:`_rows`) and its words."""

    def __init__(self) -> None:
        self._stats: OrderedDict[tuple[str, str], _Stats] = OrderedDict()
        # rowid -> (session id, position, token count, content hash).
        self._details: OrderedDict[int, tuple[int, int, int | None, str]] = OrderedDict()

    async def search(
        self,
        session: SessionRef,
        terms: Sequence[str],
        *,
        limit: int,
        before: int | None = None,
    ) -> list[SearchHit]:
        if not terms or limit <= 0:
            return []
        key = (session.tenant, session.key)
        quoted = list(dict.fromkeys(w for t in terms for w in self._words(t)))
        found = await self._match(key, quoted)
        if found is None:
            return []
        stats, totals, matches = found
        items = max(1, totals[0])
        counts = [len(matches.get(q, ())) or stats.common.get(q, 0) for q in quoted]
        cap = max(COMMON_MIN, COMMON_SHARE * items)
        for q, n in zip(quoted, counts, strict=True):
            if n > cap:
                stats.common[q] = n
                stats.common.move_to_end(q)
            elif q in matches:
                stats.common.pop(q, None)
        while len(stats.common) > TERMS:
            stats.common.popitem(last=False)
        chosen = informative(quoted, counts, items)
        missing = [t for t in chosen if t not in matches]
        if missing:
            # No term is rare, and the rarest are known to be common (so were not
            # fetched): fetch them, as ranking by them is all there is.
            again = await self._match(key, missing, force=missing)
            if again is None:
                return []
            stats, totals, more = again
            matches.update(more)
            chosen = [t for t in chosen if t in matches]
        if not chosen:
            return []
        df = dict(zip(quoted, counts, strict=True))
        idf = {t: math.log(1 + (items - df[t] + 0.5) / (df[t] + 0.5)) for t in chosen}
        rough = _rough(chosen, idf, matches)
        average = max(1.0, totals[1] / items)
        bound = _NO_LIMIT if before is None else before
        hits: list[SearchHit] = []
        step = max(1, int(BATCH * limit))
        # Best first, the newest of equals first (tuples: compared without a key function).
        ranked = sorted(zip(rough.values(), rough, strict=True), reverse=True)
        order = [rowid for _, rowid in ranked]
        for start in range(0, len(order), step):
            batch = order[start : start + step]
            for rowid, (owner, pos, tokens, content_hash) in (await self._detailed(batch)).items():
                if pos >= bound or owner != stats.session_id:
                    continue
                length = average if tokens is None else float(tokens)
                norm = (K1 + 1) / (1 + K1 * (1 - B + B * length / average))
                hits.append(SearchHit(rowid, pos, content_hash, rough[rowid] * norm))
            if len(hits) >= limit:
                break
        hits.sort(key=lambda h: (-h.score, -h.item_id))
        return hits[:limit]

    async def _detailed(self, rowids: Sequence[int]) -> dict[int, tuple[int, int, int | None, str]]:
        """Position, token count and content hash of ``rowids`` (the session checked by
        the caller's match), from the cache or the store."""
        out = {}
        missing = []
        for rowid in rowids:
            known = self._details.get(rowid)
            if known is None:
                missing.append(rowid)
            else:
                out[rowid] = known
        if missing:
            for rowid, session_id, pos, tokens, content_hash in await self._rows(missing):
                detail = (int(session_id), int(pos), tokens, str(content_hash))
                out[int(rowid)] = self._details[int(rowid)] = detail
            while len(self._details) > DETAILS:
                self._details.popitem(last=False)
        return out

    async def _match(
        self, key: tuple[str, str], terms: Sequence[str], force: Sequence[str] = ()
    ) -> tuple[_Stats, tuple[int, int, int], dict[str, list[int]]] | None:
        """The session's statistics, its totals now, and each term's matching rowids
        (terms known to be common are not fetched, unless in ``force``). None: no
        such session."""
        for _ in range(2):
            stats = self._stats.get(key)
            totals = (0, 0, 0) if stats is None else stats.totals
            # Known common terms are not fetched again while they still are.
            cap = max(COMMON_MIN, COMMON_SHARE * totals[0])
            wanted = [
                t for t in terms if stats is None or stats.common.get(t, 0) <= cap or t in force
            ]
            rows = await self._matches(key, totals[2], wanted)
            head = next((r for r in rows if r[0] == -1), None)
            if head is None:
                self._stats.pop(key, None)
                return None
            session_id = int(head[1])
            if stats is not None and stats.session_id != session_id:
                # Deleted and made again since it was counted: afresh.
                self._stats.pop(key, None)
                continue
            if stats is None:
                stats = self._stats.setdefault(key, _Stats(session_id))
            top = totals[2] if head[4] is None else int(head[4])
            now = (totals[0] + int(head[2]), totals[1] + int(head[3]), top)
            if top > stats.totals[2]:
                stats.totals = now
            self._stats.move_to_end(key)
            while len(self._stats) > SESSIONS:
                self._stats.popitem(last=False)
            matches = {
                wanted[r[0]]: list(map(int, r[1].split(","))) for r in rows if r[0] >= 0 and r[1]
            }
            return stats, now, matches
        return None

    # What a backend gives.

    def _words(self, term: str) -> Sequence[str]:
        """The index's terms for one query term."""
        raise NotImplementedError

    async def _matches(self, key: tuple[str, str], top: int, terms: Sequence[str]) -> Sequence[Any]:
        """One statement, one snapshot. Row ``(-1, session id, items, tokens, highest id)``:
        the session's items stored after id ``top``, their tokens and the highest of their
        ids (None if none); then a row ``(k, ids)`` per term ``k`` that matches, ``ids``
        comma-separated. No row at all: no such session."""
        raise NotImplementedError

    async def _rows(self, ids: Sequence[int]) -> Sequence[Any]:
        """``(id, session id, position, token count, content hash)`` of each of ``ids``."""
        raise NotImplementedError
