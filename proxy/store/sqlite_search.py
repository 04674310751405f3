"""The SQLite recall index: FTS5 (``porter unicode61``) for matching, BM25 in Python.

The table (``items_fts``, migration 5) indexes each item's searchable text
(``body``), a token naming its session in ``scope`` (``s<session id>``), and
its chain position in ``pos``. Since migration 7 it keeps no copy of them:
it is an external-content table over the view ``items_fts_source``, which
computes them from ``items`` (the text from ``message_json``, in SQL), so
positions are read from ``items.pos``, never through the view. FTS5 finds
the session's items that hold a term (``scope AND body : term``: the two
doclists merged with skips), but its ``bm25()`` walks every phrase's whole
doclist once per query for its statistics, the session's ``scope`` one
included (most of a query's time at 5,000 stored turns). So a search is:

1. one statement: the session's id, the items and tokens added to its
   index since this process last counted them (rowids only grow:
   AUTOINCREMENT; a session deleted and made again has a new id, counted
   afresh; items deleted one by one, with a deleted response, leave the
   totals a little high until the process restarts: they only weigh the
   terms), and the rowids of the session's items holding each term, the
   index alone, no row read; a term's document frequency is its count;
2. scores in Python, Okapi BM25 (k1 1.2, b 0.75) with each term counted once
   per item (term frequency needs FTS5's ranking functions; chat messages
   are short): first without length, to pick the candidates;
3. one statement for the best candidates' positions, token counts and
   content hashes (a batch at a time while ``before`` leaves too few), then
   the length normalisation with the item's stored token count, and the order.

A term found in most of a long session (:func:`informative`) weighs nearly
nothing and would bring thousands of rowids: it is left out, and remembered
as common for the session so later searches do not fetch it. Work is
proportional to the matching items and to what was stored since the last
search, not to the session.
"""

from __future__ import annotations

import functools
import math
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit

# Items with no searchable text are not indexed (as migration 5 left them out).
_INDEX = """
    INSERT INTO items_fts (rowid, scope, body, pos)
    SELECT id, scope, body, pos FROM items_fts_source WHERE id IN ({marks}) AND body != ''
"""
_CHUNK = 500

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


@functools.lru_cache(maxsize=64)
def _match_sql(terms: int) -> str:
    """Statement 1: the session, what its index gained since rowid ``?``, each term's rowids.

    Parameters: tenant, key, twice the rowid the session's totals go up to,
    then the terms. Row ``k = -1``: the session id, items and tokens added
    after that rowid, the highest rowid now; then a row (``k``, rowid) per
    match of term ``k``. One statement, so one snapshot.
    """
    values = ", ".join("(?, ?)" for _ in range(terms))
    rowids = f"""
    UNION ALL
    SELECT t.column1, f.rowid, NULL, NULL, NULL
    FROM s, (VALUES {values}) AS t CROSS JOIN items_fts f
    WHERE items_fts MATCH s.scope || ' AND body : ' || t.column2
    """
    return f"""
    WITH s AS (SELECT id, 'scope : s' || id AS scope FROM sessions WHERE tenant = ? AND key = ?)
    SELECT -1, s.id,
        (SELECT count(*) FROM items_fts WHERE items_fts MATCH s.scope AND rowid > ?),
        (SELECT coalesce(sum(i.token_count), 0) FROM items_fts f CROSS JOIN items i
            ON i.id = f.rowid WHERE items_fts MATCH s.scope AND f.rowid > ?),
        (SELECT rowid FROM items_fts WHERE items_fts MATCH s.scope ORDER BY rowid DESC LIMIT 1)
    FROM s
    {rowids if terms else ""}"""


@functools.lru_cache(maxsize=64)
def _detail_sql(rows: int) -> str:
    """Statement 3: position, token count and content hash of the candidates (rowids)."""
    marks = ", ".join("?" for _ in range(rows))
    return f"""
    SELECT id, session_id, pos, token_count, content_hash
    FROM items WHERE id IN ({marks})
    """


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


def index_items(conn: sqlite3.Connection, item_ids: Sequence[int]) -> None:
    """Index newly stored items in the transaction storing them.

    Their text comes from the view the index reads (migration 7), so the
    delete trigger later removes exactly what was indexed here.
    """
    for start in range(0, len(item_ids), _CHUNK):
        chunk = item_ids[start : start + _CHUNK]
        marks = ", ".join("?" * len(chunk))
        conn.execute(_INDEX.format(marks=marks), tuple(chunk))


def _quote(term: str) -> str:
    """A term as an FTS5 string (so no term is read as syntax)."""
    return '"' + term.replace('"', '""') + '"'


def match_expression(terms: Sequence[str]) -> str:
    """The terms as an FTS5 OR expression, each quoted."""
    return " OR ".join(_quote(t) for t in terms)


class SqliteRecallIndex:
    """:class:`~proxy.store.search.RecallIndex` on a SQLite store's read connection."""

    def __init__(self, fetch: Callable[[str, tuple[Any, ...]], Any]) -> None:
        # SqliteStore._fetch: a query on the store's aiosqlite connection.
        self._fetch = fetch
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
        quoted = list(dict.fromkeys(_quote(t) for t in terms))
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
        rough: dict[int, float] = {}
        for t in chosen:
            for rowid in matches[t]:
                rough[rowid] = rough.get(rowid, 0.0) + idf[t]
        order = sorted(rough, key=lambda r: (-rough[r], -r))
        average = max(1.0, totals[1] / items)
        bound = _NO_LIMIT if before is None else before
        hits: list[SearchHit] = []
        step = max(1, int(BATCH * limit))
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
            for rowid, session_id, pos, tokens, content_hash in await self._fetch(
                _detail_sql(len(missing)), tuple(missing)
            ):
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
            pairs = [x for k, t in enumerate(wanted) for x in (k, t)]
            rows = await self._fetch(_match_sql(len(wanted)), (*key, totals[2], totals[2], *pairs))
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
            matches: dict[str, list[int]] = {}
            for r in rows:
                if r[0] >= 0:
                    matches.setdefault(wanted[r[0]], []).append(int(r[1]))
            return stats, now, matches
        return None
