"""Okapi BM25: the one way every recall index scores an item, as pure functions and constants.

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

The index that ranks in the proxy for SQLite and PostgreSQL:
proxy/store/bm25_index.py. Pure: no I/O, no state.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from proxy.store.search_text import words

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
