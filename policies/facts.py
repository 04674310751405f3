"""Pinned facts: identifiers, numbers, codes and addresses found deterministically in text.

A summary written by a model can drop or garble the one order number a later
turn needs. The facts found here in the turns a summary replaces are carried
verbatim beside it, so no summary can lose them: emails, URLs, dates,
amounts, versions, error codes, and identifiers (order, ticket and booking
numbers, ``#1234``, mixed letter-and-digit codes such as ``HAT170`` or
``mia_li_3668``, long numbers).

The other direction is checked too: :func:`unsupported` lists the entities a
summary states (facts and numbers) that its source never mentions, so a
made-up number is flagged instead of trusted.

Pure: regular expressions only, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

# Which facts survive when there are too many: the first kinds here first
# (an order number matters more than a date), then the most recent mention.
KINDS = ("id", "error", "email", "url", "amount", "version", "date", "number")

MAX_FACTS = 40

_MONTH = (
    r"(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)"
)

# (kind, pattern), in precedence order: a span claimed by an earlier pattern
# is not matched again by a later one (the digits of a URL are no order number).
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("url", re.compile(r"\bhttps?://[^\s<>\"'`]+[^\s<>\"'`.,;:!?)\]}]")),
    ("email", re.compile(r"\b[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")),
    (
        "date",
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2})?)?\b"
            r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
            rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+{_MONTH}\.?,?\s+\d{{4}}\b"
            rf"|\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
            rf"|\b{_MONTH}\s+\d{{4}}\b"
        ),
    ),
    (
        "amount",
        re.compile(
            r"[$€£¥]\s?\d[\d,]*(?:\.\d+)?(?:\s?(?:k|K|M|bn)\b)?(?!\w)"
            r"|\b\d[\d,]*(?:\.\d+)?\s?(?:USD|EUR|GBP|CHF|JPY|dollars|euros|pounds)\b"
        ),
    ),
    (
        "error",
        re.compile(
            r"\b(?:E|ERR|ERROR)[-_]?\d{2,}\b"
            r"|\b(?:HTTP|[Ss]tatus|[Ee]rror|[Cc]ode)\s?[:#]?\s?[1-5]\d{2}\b"
            r"|\b0x[0-9A-Fa-f]{4,}\b"
            r"|\bE(?:ACCES|ADDRINUSE|CONNREFUSED|CONNRESET|NOENT|PIPE|TIMEDOUT|NOTFOUND|PERM)\b"
        ),
    ),
    ("version", re.compile(r"\b[vV]\d+(?:\.\d+)+\b|\b\d+\.\d+\.\d+(?:-[0-9A-Za-z.]+)?\b")),
    (
        "id",
        re.compile(
            # "order 1234", "ticket #A-77", "booking ref: ZX81Q": the noun stays (it says what
            # the number is).
            r"\b(?:[Oo]rder|[Tt]icket|[Cc]ase|[Ii]nvoice|[Rr]eservation|[Bb]ooking|[Cc]onfirmation"
            r"|[Aa]ccount|[Tt]racking|[Rr]ef(?:erence)?|[Cc]ustomer|[Uu]ser|[Ii]ssue|PR|[Ff]light)"
            r"(?:\s+(?:no\.?|number|num|id|ID|code))?\s*[:#]?\s*(?=[A-Za-z0-9-]*\d)[A-Za-z0-9][A-Za-z0-9-]{2,}\b"
            r"|#\d{3,}\b"
            r"|\b(?=[A-Z0-9-]*\d)(?=[A-Z0-9-]*[A-Z])[A-Z0-9][A-Z0-9-]{4,}\b"
            r"|\b[A-Za-z]+(?:_[A-Za-z]+)*_\d+\b"
            r"|\b[A-Za-z]{2,}-\d{2,}\b"
        ),
    ),
    ("number", re.compile(r"\b\d{5,}\b")),
)

# A token of an entity that must appear in the source for the entity to count as
# supported: anything with a digit in it (words like month names may be paraphrased).
_TOKEN = re.compile(r"[A-Za-z0-9_@.,%+/:#-]+")
_NUMBER = re.compile(r"\b\d[\d,]*\d(?:\.\d+)?\b")  # two digits or more: "step 1" is no entity


@dataclass(frozen=True)
class Fact:
    kind: str
    value: str

    def as_json(self) -> dict[str, str]:
        return {"kind": self.kind, "value": self.value}


def extract(texts: Iterable[str]) -> list[Fact]:
    """Every fact in ``texts``, in order of first appearance, each value once."""
    out: list[Fact] = []
    seen: set[str] = set()
    for text in texts:
        for fact in _scan(text):
            if fact.value not in seen:
                seen.add(fact.value)
                out.append(fact)
    return out


def _scan(text: str) -> list[Fact]:
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, Fact]] = []
    for kind, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            start, end = m.span()
            if any(start < b and a < end for a, b in taken):
                continue
            taken.append((start, end))
            found.append((start, Fact(kind, " ".join(m.group().split()))))
    found.sort(key=lambda pair: pair[0])
    return [fact for _, fact in found]


def merge(
    previous: Sequence[Fact],
    new: Sequence[Fact],
    *,
    max_facts: int = MAX_FACTS,
    max_tokens: int | None = None,
    count_text: Callable[[str], int] | None = None,
) -> tuple[Fact, ...]:
    """``previous`` then ``new``, de-duplicated, bounded in count and rendered tokens.

    Over a bound, facts are kept by kind (:data:`KINDS` order) and then
    recency (a newer mention outranks an older one); the survivors keep
    their original order, so a fact's place in the list is stable from one
    summary to the next.
    """
    order: dict[str, int] = {}
    facts: dict[str, Fact] = {}
    for position, fact in enumerate([*previous, *new]):
        order[fact.value] = position  # the latest mention's position is its recency
        facts.setdefault(fact.value, fact)
    first = {value: i for i, value in enumerate(facts)}
    rank = sorted(
        facts,
        key=lambda v: (_kind_rank(facts[v].kind), -order[v]),
    )
    kept: list[str] = []
    tokens = 0
    for value in rank:
        if len(kept) >= max_facts:
            break
        if max_tokens is not None and count_text is not None:
            cost = count_text(render_line(facts[value]))
            if tokens + cost > max_tokens:
                continue
            tokens += cost
        kept.append(value)
    kept.sort(key=first.__getitem__)
    return tuple(facts[v] for v in kept)


def _kind_rank(kind: str) -> int:
    return KINDS.index(kind) if kind in KINDS else len(KINDS)


def render_line(fact: Fact) -> str:
    return f"- {fact.kind}: {fact.value}"


def render(facts: Sequence[Fact]) -> str:
    """The facts as a block appended to a summary (empty when there are none)."""
    if not facts:
        return ""
    lines = "\n".join(map(render_line, facts))
    return f"Pinned facts (verbatim from the earlier turns):\n{lines}"


def unsupported(summary: str, source: str) -> list[str]:
    """Entities the summary states that the source never mentions, in order, each once.

    Entities are the summary's facts and its numbers. One is supported when
    each of its tokens that holds a digit (or an ``@``) appears in the source
    as a whole token (not inside a longer number or word), ignoring case,
    thousands separators and surrounding punctuation: ``1,234`` matches
    ``1234`` and ``#1234``, but ``order 1235`` does not match ``order 1234``
    nor ``77`` the ``1977`` of a date.
    """
    text = source.replace(",", "").lower()
    candidates = [f.value for f in extract([summary])]
    candidates += [m.group() for m in _NUMBER.finditer(summary)]
    out: list[str] = []
    for value in candidates:
        needed = [t for t in _tokens(value) if any(c.isdigit() or c == "@" for c in t)]
        if all(_mentions(text, t) for t in needed):
            continue
        # A number inside an already-flagged fact is the same finding.
        if not any(value in flagged for flagged in out):
            out.append(value)
    return out


def _tokens(text: str) -> list[str]:
    tokens = (m.group().replace(",", "").strip(".:#/-").lower() for m in _TOKEN.finditer(text))
    return [t for t in tokens if t]


def _mentions(text: str, token: str) -> bool:
    return re.search(rf"(?<![0-9a-z]){re.escape(token)}(?![0-9a-z])", text) is not None


def facts_from_json(data: object) -> tuple[Fact, ...]:
    """Facts as stored (``[{"kind": ..., "value": ...}]``); anything malformed is skipped."""
    if not isinstance(data, list):
        return ()
    out = []
    for entry in data:
        if isinstance(entry, dict):
            kind, value = entry.get("kind"), entry.get("value")
            if isinstance(kind, str) and isinstance(value, str):
                out.append(Fact(kind, value))
    return tuple(out)
