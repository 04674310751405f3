"""The SQLite recall index: FTS5 (``porter unicode61``) for matching, BM25 in Python.

The table (``items_fts``) indexes each item's searchable text with every word
in its session's own namespace, ``s<session id>_<word>`` (migration 8), and
the token ``s<session id>_`` in every indexed item of the session. It keeps
no copy of the text: it is an external-content table over the view
``items_fts_source``, which computes the prefixed text from ``items`` (the
text from ``message_json``, in SQL); it holds rowids only (``detail =
none``: no positions, no lengths), and positions are read from ``items.pos``.
A term's doclist is the session's own, so matching it reads only the
session's items that hold it (before migration 8 it was every session's,
merged on each query with the session's ``scope`` doclist: most of a query's
time at 5,000 stored turns). So a search is:

1. one statement: the session's id, the items and tokens added to its
   index since this process last counted them (rowids only grow:
   AUTOINCREMENT; a session deleted and made again has a new id, counted
   afresh; items deleted one by one, with a deleted response, leave the
   totals a little high until the process restarts: they only weigh the
   terms), and the rowids of the session's items holding each term, the
   index alone, no row read; a term's document frequency is its count;
2. scores in Python, Okapi BM25 (k1 1.2, b 0.75) with each term counted once
   per item (the index keeps no term frequencies; chat messages are short):
   first without length, to pick the candidates;
3. one statement for the best candidates' positions, token counts and
   content hashes (a batch at a time while ``before`` leaves too few), then
   the length normalisation with the item's stored token count, and the order.

A query term is looked up as the words the tokenizer makes of it (``_`` and
every separator split it, as they split the indexed text): the index has no
positions, so no phrases.

A term found in most of a long session (:func:`informative`) weighs nearly
nothing and would bring thousands of rowids: it is left out, and remembered
as common for the session so later searches do not fetch it. Work is
proportional to the matching items and to what was stored since the last
search, not to the session, nor to the other sessions.
"""

from __future__ import annotations

import functools
import math
import re
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.store.base import SessionRef
from proxy.store.search import SearchHit

# An item without searchable text has a NULL body in the view: its row adds nothing.
_INDEX = """
    INSERT INTO items_fts (rowid, body) SELECT id, body FROM items_fts_source WHERE id IN ({marks})
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

    Parameters: tenant, key, the rowid the session's totals go up to, then
    the terms (:func:`words`). Row ``k = -1``: the session id, items and
    tokens added after that rowid, the highest rowid now (NULL: none added);
    then a row (``k``, the rowids of the session's items holding term ``k``,
    comma-separated, NULL if none) per term. One statement, so one snapshot.
    The items added are read newest first, so the scan stops at that rowid.
    """
    values = ", ".join("(?, ?)" for _ in range(terms))
    rowids = f"""
    UNION ALL
    SELECT t.column1, (
        SELECT group_concat(rowid) FROM items_fts
        WHERE items_fts MATCH '"' || s.prefix || t.column2 || '"'
    ), NULL, NULL, NULL
    FROM s, (VALUES {values}) AS t
    """
    return f"""
    WITH s AS (
        SELECT id, 's' || id || '_' AS prefix, '"s' || id || '_"' AS scope
        FROM sessions WHERE tenant = ? AND key = ?
    ),
    added AS (
        SELECT count(*) AS items, coalesce(sum(i.token_count), 0) AS tokens, max(f.id) AS top
        FROM (
            SELECT rowid AS id FROM items_fts
            WHERE items_fts MATCH coalesce((SELECT scope FROM s), '""') AND rowid > ?
            ORDER BY rowid DESC
        ) AS f CROSS JOIN items i ON i.id = f.id
    )
    SELECT -1, s.id, added.items, added.tokens, added.top FROM s, added
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


_ASCII_WORD = re.compile(r"[a-z0-9]+")
# unicode61 as the index has it (``_`` a token character), without porter: the
# words it makes of a non-ASCII term. One in-memory table, behind a lock.
_PROBE = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
_PROBE.execute(
    "CREATE VIRTUAL TABLE probe USING fts5 (body, tokenize = 'unicode61 tokenchars ''_''')"
)
_PROBE.execute("CREATE VIRTUAL TABLE probe_words USING fts5vocab (probe, instance)")
_PROBE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=8192)
def words(term: str) -> tuple[str, ...]:
    """The index's words for a query term, each one token of the indexed text.

    The view writes a space for ``_`` and for each separator, so they split a
    term here too; a letter unicode61 does not know splits it as in the text.
    Letters and digits only: no FTS5 syntax can come through.
    """
    term = term.lower().replace("_", " ")
    if term.isascii():
        return tuple(_ASCII_WORD.findall(term))
    with _PROBE_LOCK:
        _PROBE.execute("BEGIN")
        try:
            _PROBE.execute("INSERT INTO probe (body) VALUES (?)", (term,))
            found = _PROBE.execute("SELECT term FROM probe_words ORDER BY offset").fetchall()
        finally:
            _PROBE.execute("ROLLBACK")
    return tuple(str(w) for (w,) in found)


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
        quoted = list(dict.fromkeys(w for t in terms for w in words(t)))
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
        get = rough.get
        for t in chosen:
            weight = idf[t]
            for rowid in matches[t]:
                rough[rowid] = get(rowid, 0.0) + weight
        # Best first, the newest of equals first (tuples: compared without a key function).
        ranked = sorted(zip(rough.values(), rough, strict=True), reverse=True)
        order = [rowid for _, rowid in ranked]
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
            rows = await self._fetch(_match_sql(len(wanted)), (*key, totals[2], *pairs))
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
                wanted[r[0]]: [int(x) for x in r[1].split(",")] for r in rows if r[0] >= 0 and r[1]
            }
            return stats, now, matches
        return None
