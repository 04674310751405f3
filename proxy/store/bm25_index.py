"""The recall index that ranks in the proxy, for SQLite and PostgreSQL, by the one BM25
(proxy/store/bm25.py).

SQLite's (proxy/store/sqlite_search.py) and PostgreSQL's
(proxy/store/postgres_search.py) ask their database only for what an index
answers without reading rows: the session's id, what was stored
in it since this process last counted (items and their tokens, ids only grow),
and the ids of the session's items holding each term. Then, here:

1. each term's ``n`` is its count; common terms (:func:`~proxy.store.bm25.informative`)
   are remembered as such for the session, so later searches do not fetch them;
2. the candidates grouped by the terms they hold, the group that can score
   most first (:class:`_Scores`: its scores computed once per token count, as
   most candidates say each term once); a group whose most cannot reach the
   ``limit``-th best so far ends the walk, with every group after it: their
   candidates are never scored (a ``limit`` above :data:`READ` walks them all);
3. every candidate's position, token count and content hash (:class:`Detail`,
   read once, in one statement, and kept: an item never changes);
4. the words the candidates' messages say more than once
   (:func:`~proxy.store.bm25.repeated`,
   also kept: a chat message repeats few words, and any other term the index
   found in it is said once), for the candidates whose best can still reach
   the ``limit``-th least (each term said once), at most :data:`READ` of them;
5. the exact scores and the order, best first and the newest of equals first.
   Exact as the other backends' unless more than :data:`READ` candidates can
   still rank, which takes a query of common words only.

A session's totals are kept per process: a session deleted and made again
has a new id and is counted afresh; items deleted one by one (a deleted
response) leave them a little high until the process restarts (they only
weigh the terms). Work is proportional to the matching items and to what
was stored since the last search, not to the session.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar

import orjson

from proxy.store.base import SessionRef
from proxy.store.bm25 import (
    COMMON_MIN,
    COMMON_SHARE,
    K1,
    average_length,
    frequency,
    informative,
    repeated,
    score,
    weight,
)
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text, words

# Sessions whose statistics are kept (least recently searched go first), and
# terms per session.
SESSIONS = 256
TERMS = 4096


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


class Detail(NamedTuple):
    """What ranking needs of a candidate item beyond the index: read once, kept (an item
    never changes)."""

    session_id: int
    position: int
    tokens: int | None
    content_hash: str


# Items' details kept, and items' repeated words (:func:`repeated`) kept.
DETAILS = 50_000
REPEATS = 50_000
# Most messages read in one search: more candidates can still rank (only when a
# query has no rare word, so its common words' items are the candidates), those
# that score best with each term said once are read.
READ = 512
# Ids per statement (SQLite allows 32,766 parameters; a plan per size is cached).
CHUNK = 500


# Most items' repeats (one object for all of them).
_NONE: Mapping[str, int] = MappingProxyType({})

# Far above any chain's length: "no ``before``".
_NO_LIMIT = 1 << 62


V = TypeVar("V")


async def _through(
    cache: OrderedDict[int, V],
    keep: int,
    rowids: Sequence[int],
    fetch: Callable[[Sequence[int]], Awaitable[Sequence[Any]]],
    read: Callable[[Any], V],
) -> dict[int, V]:
    """What ``cache`` holds of ``rowids``, and the rest fetched (rows whose first column
    is the id, :data:`CHUNK` at a time), read and kept (the ``keep`` most recent)."""
    # Comprehensions: most of a search's candidates are known (the hot path).
    out = {rowid: known for rowid in rowids if (known := cache.get(rowid)) is not None}
    missing = [rowid for rowid in rowids if rowid not in out] if len(out) < len(rowids) else []
    for start in range(0, len(missing), CHUNK):
        for row in await fetch(missing[start : start + CHUNK]):
            out[int(row[0])] = cache[int(row[0])] = read(row)
    while len(cache) > keep:
        cache.popitem(last=False)
    return out


class _Scores:
    """One search's :func:`~proxy.store.bm25.score` of its candidates, each given as the
    mask of the ``chosen`` terms it holds (bit i: ``chosen[i]``, so summed in their order)
    and its token count. Most candidates say each of their terms once, and many share
    their terms and their length: those scores are computed once a search."""

    def __init__(self, chosen: Sequence[str], weights: Mapping[str, float], average: float):
        self._weights = [weights[t] for t in chosen]
        # A term's words (one, mostly; several: the rarest counts, :func:`frequency`).
        self._stems = [tuple(words(t)) for t in chosen]
        self._any = frozenset(w for ws in self._stems for w in ws)
        self._average = average
        self._terms: dict[int, list[int]] = {}
        self._once: dict[tuple[int, int | None], float] = {}
        self._most: dict[int, float] = {}

    def _indices(self, mask: int) -> list[int]:
        found = self._terms.get(mask)
        if found is None:
            found = [i for i in range(len(self._weights)) if mask >> i & 1]
            self._terms[mask] = found
        return found

    def once(self, mask: int, tokens: int | None) -> float:
        """The score of an item saying each of its terms once (the least it can have)."""
        value = self._once.get((mask, tokens))
        if value is None:
            pairs = [(self._weights[i], 1) for i in self._indices(mask)]
            value = self._once[mask, tokens] = score(pairs, tokens, self._average)
        return value

    def exact(self, mask: int, tokens: int | None, repeats: Mapping[str, int]) -> float:
        """The score of an item that repeats ``repeats`` (:func:`~proxy.store.bm25.repeated`)."""
        # Most items repeat none of the query's words (a test in C, over the few it repeats).
        if not self._any.isdisjoint(repeats):
            indices = self._indices(mask)
            said = [frequency(repeats, self._stems[i]) for i in indices]
            if any(n > 1 for n in said):
                pairs = [(self._weights[i], n) for i, n in zip(indices, said, strict=True)]
                return score(pairs, tokens, self._average)
        return self.once(mask, tokens)

    def most(self, mask: int) -> float:
        """More than the item can score, whatever its frequencies and length: a term adds
        less than weight * (K1 + 1)."""
        value = self._most.get(mask)
        if value is None:
            value = self._most[mask] = sum((K1 + 1) * self._weights[i] for i in self._indices(mask))
        return value


class Bm25Index:
    """A :class:`~proxy.store.search.RecallIndex` ranking in the proxy; a backend
    gives it its three statements (:meth:`_matches`, :meth:`_rows`, :meth:`_texts`) and
    its words."""

    def __init__(self) -> None:
        self._stats: OrderedDict[tuple[str, str], _Stats] = OrderedDict()
        self._details: OrderedDict[int, Detail] = OrderedDict()
        self._repeats: OrderedDict[int, Mapping[str, int]] = OrderedDict()

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
        # One of the index's terms per stem (so per term of the other backends'): two
        # words of one stem would count its items twice.
        quoted: list[str] = []
        seen: set[tuple[str, ...]] = set()
        for w in (w for t in terms for w in self._words(t)):
            if (stem := tuple(words(w))) not in seen:
                seen.add(stem)
                quoted.append(w)
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
        weights = {t: weight(items, df[t]) for t in chosen}
        # Each candidate's terms as a mask (bit i: ``chosen[i]``), so in the order of
        # ``chosen``: its sum is the same floats as the other backends'
        # (proxy/store/memory_search.py, the Redis script).
        held: dict[int, int] = {}
        for i, t in enumerate(chosen):
            bit = 1 << i
            for rowid in matches[t]:
                held[rowid] = held.get(rowid, 0) | bit
        # The candidates by their terms, those that can score most first.
        score_of = _Scores(chosen, weights, average_length(totals[1], items))
        groups: dict[int, list[int]] = {}
        for rowid, mask in held.items():
            groups.setdefault(mask, []).append(rowid)
        bound = _NO_LIMIT if before is None else before
        # Candidates whose repeated words are known score exactly; the others' least
        # (each term said once) is scored, and their messages read only if their most
        # (a term adds less than weight * (K1 + 1) whatever its frequency) reaches the
        # limit-th best of all (``best``, the ``limit`` best values so far): at most READ
        # of them, the best by their least. Once a group's most is below it, so are the
        # others' (sorted): never looked at.
        live: dict[int, Detail] = {}
        ranked: list[tuple[float, int]] = []
        unread: list[tuple[float, int]] = []
        best: list[float] = []
        known, once, session_id = self._repeats.get, score_of.once, stats.session_id
        # Details not known yet read in one statement (a round trip per group would cost
        # more than the rows a walk leaves out).
        if unknown := [rowid for rowid in held if rowid not in self._details]:
            await self._detailed(unknown)
        for mask in sorted(groups, key=score_of.most, reverse=True):
            # A hair below: bounds summed in another order than the scores.
            if len(best) == limit <= READ and score_of.most(mask) < best[-1] * (1 - 1e-9):
                break
            fresh = [
                (rowid, detail)
                for rowid, detail in (await self._detailed(groups[mask])).items()
                if detail.position < bound and detail.session_id == session_id
            ]
            live.update(fresh)
            values = []
            for rowid, detail in fresh:
                repeats = known(rowid)
                if repeats is None:
                    unread.append((value := once(mask, detail.tokens), rowid))
                else:
                    ranked.append((value := score_of.exact(mask, detail.tokens, repeats), rowid))
                values.append(value)
            best = sorted([*best, *values], reverse=True)[:limit]
        if unread:
            floor = best[-1] * (1 - 1e-9) if len(best) == limit else -math.inf
            unread = [(s, r) for s, r in unread if score_of.most(held[r]) >= floor]
            said = await self._repeated([r for _, r in heapq.nlargest(READ, unread)])
            ranked += [
                (score_of.exact(held[r], live[r].tokens, repeats), r) for r, repeats in said.items()
            ]
        # Best first, the newest of equals first (ids grow).
        return [
            SearchHit(rowid, live[rowid].position, live[rowid].content_hash, value)
            for value, rowid in heapq.nlargest(limit, ranked)
        ]

    async def _repeated(self, rowids: Sequence[int]) -> dict[int, Mapping[str, int]]:
        """The words each of ``rowids`` says more than once, from the cache or its message."""

        def read(row: Any) -> Mapping[str, int]:
            return repeated(search_text(orjson.loads(row[1]))) or _NONE

        return await _through(self._repeats, REPEATS, rowids, self._texts, read)

    async def _detailed(self, rowids: Sequence[int]) -> dict[int, Detail]:
        """The details of ``rowids`` (the session checked by the caller's match), from the
        cache or the store."""

        def read(row: Any) -> Detail:
            _, session_id, pos, tokens, content_hash = row
            return Detail(int(session_id), int(pos), tokens, str(content_hash))

        return await _through(self._details, DETAILS, rowids, self._rows, read)

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

    async def _texts(self, ids: Sequence[int]) -> Sequence[Any]:
        """``(id, message JSON)`` of each of ``ids``."""
        raise NotImplementedError
