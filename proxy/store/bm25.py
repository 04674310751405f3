"""Okapi BM25, the one way every recall index scores an item, and the index that ranks in the proxy.

**The score** (:func:`score`; the in-memory fake, PostgreSQL and SQLite call
it, and the Redis search script computes it from :data:`SCRIPT_ARGS`, its
arguments, with the same operations in the same order) of an item for the
chosen query terms is the sum, over those it holds, of

    weight(t) * tf * (K1 + 1) / (tf + K1 * (1 - B + B * length / average))

- ``weight(t) = ln(1 + (N - n + 0.5) / (n + 0.5))``: ``N`` the session's
  indexed items (those with searchable words), ``n`` those holding ``t``.
  Lucene's form, never negative: FTS5's ``bm25()`` takes ``ln((N - n + 0.5) /
  (n + 0.5))``, below zero (FTS5 clamps it to 1e-6) for a word in more than
  half the items, which in a short session is most of the words it shares.
- ``tf``: how often the item says ``t``, as :func:`proxy.store.search_text.words`
  counts the words of its searchable text (Porter stems), at least 1 when the
  backend's own index says the item holds it. Counted: the contract promises
  that more occurrences score higher (proxy/store/search.py).
- ``length``: the item's stored token count (every backend has it without
  reading the text; an unknown or zero count is the average), and
  ``average`` the session's indexed items' tokens over ``N`` (at least 1).

Why a function of ours and not FTS5's ``bm25()``: the SQLite index is
``detail = none, columnsize = 0`` (migration 8: rowids only, 39 bytes an item
on LoCoMo against 150 with positions), so FTS5 knows neither term frequencies
nor lengths, and a ``bm25()`` over it would count every term once in items
all of average length; its idf would also be negative for a word in more than
half the items. PostgreSQL has no BM25 at all, Redis no full-text index. The
databases find the candidates; the score is computed here, from values every
backend has, so that the four rank alike (tests/store/test_search_ranking.py).

**Which terms count** (:func:`informative`): a term in more than
``COMMON_SHARE`` of the session's items (and more than ``COMMON_MIN``) is left
out when rarer terms are there: its weight is near nothing, but ranking every
item it matches is most of a query's time (bench/recall.py); with no rare term,
the two rarest.

**The index** (:class:`Bm25Index`): SQLite's (proxy/store/sqlite_search.py)
and PostgreSQL's (proxy/store/postgres_search.py) ask their database only for
what an index answers without reading rows: the session's id, what was stored
in it since this process last counted (items and their tokens, ids only grow),
and the ids of the session's items holding each term. Then, here:

1. each term's ``n`` is its count; common terms (above) are remembered as
   such for the session, so later searches do not fetch them;
2. every candidate's position, token count and content hash (:class:`Detail`,
   read once and kept: an item never changes);
3. the words the candidates' messages say more than once (:func:`repeated`,
   also kept: a chat message repeats few words, and any other term the index
   found in it is said once), for the candidates whose best can still reach
   the ``limit``-th least (each term said once), at most :data:`READ` of them;
4. the exact scores and the order, best first and the newest of equals first.
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
from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit
from proxy.store.search_text import search_text, words

# Term frequency saturation and length normalisation (the usual Okapi values).
K1 = 1.2
B = 0.75

# A term in more of the session's items than this (and than COMMON_MIN) is
# left out when rarer terms are there: its BM25 weight is near nothing, but
# ranking every item it matches is most of a query's time (bench/recall.py).
COMMON_SHARE = 0.05
COMMON_MIN = 50

# What the Redis search script is handed (ARGV), in this order: its only BM25 constants.
SCRIPT_ARGS: tuple[float, ...] = (K1, B, COMMON_SHARE, COMMON_MIN)

# Sessions whose statistics are kept (least recently searched go first), and
# terms per session.
SESSIONS = 256
TERMS = 4096


def weight(items: int, holding: int) -> float:
    """A term's inverse document frequency: ``holding`` of the session's ``items`` hold it."""
    return math.log(1 + (items - holding + 0.5) / (holding + 0.5))


def average_length(tokens: int, items: int) -> float:
    """The session's average item length: its indexed items' ``tokens`` over ``items``."""
    return max(1.0, tokens / max(1, items))


def score(
    terms: Iterable[tuple[float, int]],
    tokens: int | None,
    average: float,
    *,
    k1: float = K1,
    b: float = B,
) -> float:
    """An item's BM25 score: ``terms`` its matching terms' (weight, frequency), in query
    order; ``tokens`` its stored token count (unknown or zero: the average)."""
    length = float(tokens) if tokens else average
    norm = k1 * (1 - b + b * length / average)
    total = 0.0
    for w, tf in terms:
        total += w * tf * (k1 + 1) / (tf + norm)
    return total


def repeated(text: str) -> dict[str, int]:
    """The words (:func:`words`) ``text`` says more than once, with how often: a chat
    message repeats few, so an index keeps them for every item it has read."""
    said = Counter(words(text))
    return {w: n for w, n in said.items() if n > 1}


def frequency(repeats: Mapping[str, int], stems: Sequence[str]) -> int:
    """How often an item whose index holds a term says it: ``repeats`` its :func:`repeated`,
    ``stems`` the term's words (several: the rarest of them). At least once: the index
    found it there, even where its stemmer and Porter disagree."""
    return min((repeats.get(s, 1) for s in stems), default=1)


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
        # Each candidate's terms, in the order of ``chosen``: its sum is the same floats
        # as the other backends' (proxy/store/memory_search.py, the Redis script).
        held: dict[int, list[str]] = {}
        for t in chosen:
            for rowid in matches[t]:
                held.setdefault(rowid, []).append(t)
        average = average_length(totals[1], items)
        bound = _NO_LIMIT if before is None else before
        live = {
            rowid: detail
            for rowid, detail in (await self._detailed(list(held))).items()
            if detail.position < bound and detail.session_id == stats.session_id
        }
        # A term's words (one, mostly: looked up directly, the hot loop of a search).
        stems = {t: tuple(words(t)) for t in chosen}
        single = {t: ws[0] for t, ws in stems.items() if len(ws) == 1}

        def exact(rowid: int, repeats: Mapping[str, int]) -> float:
            pairs = [
                (
                    weights[t],
                    repeats.get(single[t], 1) if t in single else frequency(repeats, stems[t]),
                )
                for t in held[rowid]
            ]
            return score(pairs, live[rowid].tokens, average)

        # Candidates whose repeated words are known score exactly; the others' least
        # (each term said once) is scored, and their messages read only if their most
        # (a term adds less than weight * (K1 + 1) whatever its frequency) reaches the
        # limit-th best of all: at most READ of them, the best by their least.
        ranked = []
        unread = []
        for rowid in live:
            repeats = self._repeats.get(rowid)
            if repeats is None:
                unread.append((exact(rowid, _NONE), rowid))
            else:
                ranked.append((exact(rowid, repeats), rowid))
        if unread:
            floor = -math.inf
            if len(ranked) + len(unread) > limit:
                # A hair below: bounds summed in another order than the scores.
                floor = heapq.nlargest(limit, [*ranked, *unread])[-1][0] * (1 - 1e-9)
            most = {t: (K1 + 1) * w for t, w in weights.items()}
            unread = [(s, r) for s, r in unread if sum(most[t] for t in held[r]) >= floor]
            said = await self._repeated([r for _, r in heapq.nlargest(READ, unread)])
            ranked += [(exact(r, repeats), r) for r, repeats in said.items()]
        # Best first, the newest of equals first (ids grow).
        return [
            SearchHit(rowid, live[rowid].position, live[rowid].content_hash, value)
            for value, rowid in heapq.nlargest(limit, ranked)
        ]

    async def _repeated(self, rowids: Sequence[int]) -> dict[int, Mapping[str, int]]:
        """The words each of ``rowids`` says more than once, from the cache or its message."""
        out = {}
        missing = []
        for rowid in rowids:
            known = self._repeats.get(rowid)
            if known is None:
                missing.append(rowid)
            else:
                out[rowid] = known
        for start in range(0, len(missing), CHUNK):
            for rowid, message in await self._texts(missing[start : start + CHUNK]):
                found = repeated(search_text(orjson.loads(message))) or _NONE
                out[int(rowid)] = self._repeats[int(rowid)] = found
        while len(self._repeats) > REPEATS:
            self._repeats.popitem(last=False)
        return out

    async def _detailed(self, rowids: Sequence[int]) -> dict[int, Detail]:
        """The details of ``rowids`` (the session checked by the caller's match), from the
        cache or the store."""
        out = {}
        missing = []
        for rowid in rowids:
            known = self._details.get(rowid)
            if known is None:
                missing.append(rowid)
            else:
                out[rowid] = known
        for start in range(0, len(missing), CHUNK):
            chunk = missing[start : start + CHUNK]
            for rowid, session_id, pos, tokens, content_hash in await self._rows(chunk):
                detail = Detail(int(session_id), int(pos), tokens, str(content_hash))
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

    async def _texts(self, ids: Sequence[int]) -> Sequence[Any]:
        """``(id, message JSON)`` of each of ``ids``."""
        raise NotImplementedError
