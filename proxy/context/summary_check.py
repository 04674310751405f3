"""Whether a model's summary is one: checked before it is stored.

A small or badly prompted model (its instructions dropped by a chat template
that shows no system message) answers a summarizer call by continuing or
repeating the transcript it was given; a model stopped at ``max_tokens``
returns a summary cut off mid-sentence. Stored, either would stand in for the
turns it "summarized" on every later request of the session. So a summary is
refused (:class:`~proxy.context.summarizer.SummaryFailed`, and the request
falls back to trimming) when:

- it was cut off: ``finish_reason: length``;
- it echoes its input: it opens with the transcript's own first words, or most
  of its word 8-grams are runs copied from the transcript. A summary copies
  identifiers and short phrases; eight words in a row, over and over, is a copy.

Pure functions over strings; the summarizer calls them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Word n-grams compared, and the share of the summary's that may come from the input.
SHINGLE = 8
MAX_COPIED = 0.5
# Words at the start of the summary that, equal to the transcript's first, make it an echo.
OPENING_WORDS = 12
# Labels the transcript puts before each message ("[user]", "[assistant called ...]").
_LABEL = re.compile(r"^\s*\[[^\]\n]{1,80}\]\s*$", re.MULTILINE)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Verdict:
    """``reason``: None for a usable summary, else ``cut_off`` or ``echo``; why, in ``detail``."""

    reason: str | None
    detail: str = ""


def _words(text: str) -> list[str]:
    return _WORD.findall(_LABEL.sub(" ", text).lower())


def copied_share(summary: str, source: str) -> float:
    """The share of the summary's word 8-grams that occur in ``source`` as they are."""
    words = _words(summary)
    if len(words) < SHINGLE:
        return 0.0
    theirs = _words(source)
    seen = {tuple(theirs[i : i + SHINGLE]) for i in range(len(theirs) - SHINGLE + 1)}
    mine = [tuple(words[i : i + SHINGLE]) for i in range(len(words) - SHINGLE + 1)]
    return sum(1 for gram in mine if gram in seen) / len(mine)


def check_summary(text: str, transcript: str, finish_reason: str | None) -> Verdict:
    """Whether ``text``, the model's answer to summarize ``transcript``, may be stored."""
    if finish_reason == "length":
        return Verdict("cut_off", "the summary stopped at the summarizer's max_tokens")
    words, theirs = _words(text), _words(transcript)
    opening = min(OPENING_WORDS, len(theirs))
    if opening >= 4 and words[:opening] == theirs[:opening]:
        return Verdict("echo", "the answer opens by repeating the transcript")
    share = copied_share(text, transcript)
    if share > MAX_COPIED:
        return Verdict("echo", f"{share:.0%} of the answer's 8-word runs are copied from its input")
    return Verdict(None)
