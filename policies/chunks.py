"""A summary's range in chunks that each fit the summarizer's window.

A long range (the first compaction of a very long session) can hold more
than a small summarizer model reads at once. It is then summarized in
chunks, oldest first, each call extending the previous call's partial
summary with the next chunk (the same incremental step as a stored summary
extended by newer turns), within a bounded number of calls.

Pure: no I/O; the caller counts each message's share of the transcript.
"""

from __future__ import annotations

from collections.abc import Sequence

# The most summarizer calls one summary may take; a range needing more is not
# chunked (the caller's fallback answers: it would wait too long).
MAX_CALLS = 8


def chunks(
    indexes: Sequence[int], costs: Sequence[int], room: int, most: int = MAX_CALLS
) -> list[tuple[int, ...]] | None:
    """``indexes`` split in order into runs whose ``costs`` (one per index) sum to at
    most ``room`` each; one alone over ``room`` is a run of its own (its transcript
    block is clipped already). None: more than ``most`` runs, or no room at all."""
    if room <= 0:
        return None
    out: list[tuple[int, ...]] = []
    run: list[int] = []
    used = 0
    for index, cost in zip(indexes, costs, strict=True):
        if run and used + cost > room:
            out.append(tuple(run))
            run, used = [], 0
        run.append(index)
        used += cost
    if run:
        out.append(tuple(run))
    return out if len(out) <= most else None
