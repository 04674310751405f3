"""The words of the newest user message that a recall search looks for.

Lower-cased ``\\w+`` runs, without English stopwords (question words
included: "when did", "what is" name nothing), one-letter words and
duplicates, longest first when there are too many (long words are the rare,
telling ones). The index ORs them and ranks by BM25, so a word in no stored
turn costs nothing and rare words weigh most.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

MAX_TERMS = 24
_WORD = re.compile(r"\w+")

_STOPWORDS = """
    a about above after again against all am an and any are aren arent as at be because been
    before being below between both but by can cannot could couldn did didn didnt do does doesn
    doesnt doing don dont down during each else ever few for from further get gets got had hadn
    has hasn have haven having he her here hers herself him himself his how i if in into is isn
    it its itself just let lets like me might more most much must my myself no nor not now of
    off on once one only or other ought our ours ourselves out over own really same say says
    shall she should shouldn so some such tell than that thats the their theirs them themselves
    then there these they thing things this those through to too under until up upon us very
    was wasn we were weren what whats when where which while who whom whose why will with won
    would wouldn yes yet you your yours yourself yourselves also again ok okay please thanks
    thank hi hello hey oh well sure know think going want wanted kind sort way ll re ve
    """
STOPWORDS = frozenset(_STOPWORDS.split())


def words_of(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def query_terms(
    text: str, max_terms: int = MAX_TERMS, exclude: frozenset[str] = frozenset()
) -> list[str]:
    """``exclude``: words never worth searching for here (the system prompt's: always forwarded)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(word) < 2 or word in STOPWORDS or word in seen or word in exclude:
            continue
        seen[word] = None
    terms = list(seen)
    if len(terms) > max_terms:
        keep = set(sorted(terms, key=len, reverse=True)[:max_terms])
        terms = [t for t in terms if t in keep]
    return terms


def expansion_terms(
    texts: Sequence[str],
    query: Sequence[str],
    exclude: frozenset[str] = frozenset(),
    max_terms: int = MAX_TERMS,
) -> list[str]:
    """Words of the best hits' ``texts`` to search for again (pseudo-relevance
    feedback): content words of three letters or more that are not the query's,
    those in more of the texts first, then those of the better hit, then longer."""
    asked = set(query)
    seen: dict[str, list[int]] = {}
    for rank, text in enumerate(texts):
        for word in query_terms(text, max_terms=1 << 30, exclude=exclude):
            if len(word) < 3 or word.isdigit() or word in asked:
                continue
            entry = seen.setdefault(word, [0, rank])
            entry[0] += 1
    return sorted(seen, key=lambda w: (-seen[w][0], seen[w][1], -len(w)))[:max_terms]
