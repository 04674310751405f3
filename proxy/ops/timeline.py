"""What one request did to each message it was sent: the viewer's (and CLI's) timeline.

A request row keeps the policy's decision as positions in the conversation
as received (dropped, repaired, clipped, summarized; recalled and masked
where those policies ran). Mapped onto the stored chain, the positions give
each message a *fate* and its tokens, so the timeline can say how the
tokens as sent split into kept, clipped, masked, summarized, recalled and
dropped, and how the tokens forwarded split into kept, clipped, masked,
recalled and the summary. ``other`` is what no message accounts for (tool
definitions, reply priming, message framing the counts leave out): it makes
each split sum to the row's own ``tokens_before`` / ``tokens_after``, so
the numbers shown always equal the request's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.store.base import StoredItem, positions

# Fates, in the order the viewer's legend lists them.
KEPT, CLIPPED, MASKED, SUMMARIZED, RECALLED, DROPPED = (
    "kept",
    "clipped",
    "masked",
    "summarized",
    "recalled",
    "dropped",
)


@dataclass(frozen=True)
class Shortened:
    """A message forwarded shorter than it was sent (a clipped or masked tool result)."""

    tokens_before: int
    tokens_after: int


def _index(entry: object) -> int | None:
    if isinstance(entry, bool):
        return None
    if isinstance(entry, int):
        return entry
    if isinstance(entry, Mapping):
        for name in ("index", "position"):
            value = entry.get(name)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _number(entry: object, *names: str) -> float | None:
    if not isinstance(entry, Mapping):
        return None
    for name in names:
        value = entry.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None


@dataclass(frozen=True)
class RecallView:
    """What recall did for a request, read from its row's ``detail["recall"]``.

    Recall forwards the turns it brings back as one quoted block (``tokens``
    long) before the newest user turn; the turns' own positions stay among
    the dropped ones, so here they are what the block stands for.
    """

    status: str | None
    tokens: int
    budget: int | None
    # Each recalled unit as [start, end) positions, in conversation order.
    units: tuple[tuple[int, int], ...]
    # The hits (positions the index matched) with their item id and score.
    hits: Mapping[int, tuple[int | None, float]]
    error: str | None

    @property
    def indexes(self) -> list[int]:
        return [i for start, end in self.units for i in range(start, end)]


def recall_of(detail: Mapping[str, Any]) -> RecallView | None:
    """None when recall did not run for the request (its policy has no ``recall:``)."""
    raw = detail.get("recall")
    if not isinstance(raw, Mapping):
        return None
    units: list[tuple[int, int]] = []
    for span in raw.get("spans") or []:
        if (
            isinstance(span, Sequence)
            and len(span) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in span)
            and 0 <= span[0] < span[1]
        ):
            units.append((span[0], span[1]))
    hits: dict[int, tuple[int | None, float]] = {}
    for hit in raw.get("hits") or []:
        if isinstance(hit, Sequence) and len(hit) == 3 and isinstance(hit[0], int):
            item_id = hit[1] if isinstance(hit[1], int) else None
            score = hit[2] if isinstance(hit[2], int | float) else 0.0
            hits[hit[0]] = (item_id, float(score))
    tokens = raw.get("tokens")
    budget = raw.get("budget")
    status, error = raw.get("status"), raw.get("error")
    return RecallView(
        status=status if isinstance(status, str) else None,
        tokens=tokens if isinstance(tokens, int) and units else 0,
        budget=budget if isinstance(budget, int) else None,
        units=tuple(sorted(units)),
        hits=hits,
        error=error if isinstance(error, str) else None,
    )


def recall_view(
    recall: RecallView | None, chain: Sequence[StoredItem] | None
) -> dict[str, Any] | None:
    """The request view's ``recalled``: each unit with its positions, items and best score."""
    if recall is None:
        return None

    def item_id(i: int) -> int | None:
        return chain[i].id if chain is not None and i < len(chain) else None

    units = []
    for start, end in recall.units:
        hits = [
            {"index": i, "item_id": recall.hits[i][0] or item_id(i), "score": recall.hits[i][1]}
            for i in range(start, end)
            if i in recall.hits
        ]
        units.append(
            {
                "start": start,
                "end": end,
                "item_ids": [item_id(i) for i in range(start, end)],
                # The unit came back for its best hit (neighbors have no score of their own).
                "score": max(
                    (recall.hits[i][1] for i in range(start, end) if i in recall.hits), default=None
                ),
                "hits": hits,
            }
        )
    return {
        "status": recall.status,
        "turns": len(recall.units),
        "messages": len(recall.indexes),
        "tokens": recall.tokens,
        "budget": recall.budget,
        "units": units,
        "error": recall.error,
    }


def _shortened(raw: object) -> dict[int, Shortened]:
    out: dict[int, Shortened] = {}
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        return out
    for entry in raw:
        index = _index(entry)
        before = _number(entry, "tokens_before")
        after = _number(entry, "tokens_after")
        if index is not None and before is not None and after is not None:
            out[index] = Shortened(int(before), int(after))
    return out


def clipped_by_index(detail: Mapping[str, Any]) -> dict[int, Shortened]:
    return _shortened(detail.get("clipped"))


def masked_by_index(detail: Mapping[str, Any]) -> dict[int, Shortened]:
    """Tool results observation masking replaced (``detail["masked"]``), when it ran."""
    masked = detail.get("masked")
    if isinstance(masked, Mapping):
        masked = masked.get("items") or masked.get("masked")
    return _shortened(masked)


def request_chain(
    row: Mapping[str, Any], history: Sequence[StoredItem], position_of: Mapping[int, int]
) -> list[StoredItem] | None:
    """The stored items the request's positions name, oldest first.

    None when they cannot be named from the current branch: a failed call
    stores no messages, and a request on an edited or forked branch names
    items the current branch does not hold.
    """
    last = row.get("last_item_id")
    if not isinstance(last, int) or last not in position_of:
        return None
    chain = list(history[: position_of[last] + 1])
    if len(chain) != row.get("messages_before") or chain[0].id != row.get("first_item_id"):
        return None
    return chain


def fates(
    row: Mapping[str, Any], summarized: Sequence[int], recall: RecallView | None
) -> dict[int, tuple[str, str | None]]:
    """Each position's fate and, for a dropped one, why (positions not listed were kept)."""
    detail: Mapping[str, Any] = row.get("detail") or {}
    out: dict[int, tuple[str, str | None]] = {}
    repaired = set(detail.get("repaired", []))
    for index in positions(row.get("dropped_spans", [])):
        out[index] = (DROPPED, "orphan" if index in repaired else row.get("reason"))
    for index in masked_by_index(detail):
        out[index] = (MASKED, None)
    for index in clipped_by_index(detail):
        out[index] = (CLIPPED, None)
    for index in summarized:
        out[index] = (SUMMARIZED, None)
    for index in recall.indexes if recall is not None else ():
        out[index] = (RECALLED, None)
    return out


def token_split(
    row: Mapping[str, Any],
    chain: Sequence[StoredItem] | None,
    summarized: Sequence[int],
    summary_tokens: int | None,
) -> dict[str, Any]:
    """The tokens as sent and as forwarded, by fate; each sums to the row's total.

    ``exact`` is False when some message's tokens are unknown (no stored
    chain to read them from): what is unknown is then in ``other``.
    """
    detail: Mapping[str, Any] = row.get("detail") or {}
    recall = recall_of(detail)
    fate = fates(row, summarized, recall)
    clipped, masked = clipped_by_index(detail), masked_by_index(detail)
    sent = dict.fromkeys((KEPT, CLIPPED, MASKED, SUMMARIZED, RECALLED, DROPPED), 0)
    forwarded = dict.fromkeys((KEPT, CLIPPED, MASKED, RECALLED), 0)
    count = int(row.get("messages_before") or 0)
    exact = chain is not None and len(chain) == count
    for index in range(count):
        tokens = chain[index].token_count if chain is not None and exact else None
        kind = fate.get(index, (KEPT, None))[0]
        short = clipped.get(index) or masked.get(index)
        if tokens is None:
            # Unknown from the chain; a shortened message still says its own size.
            tokens = short.tokens_before if short else None
            if tokens is None:
                exact = False
                continue
        sent[kind] += tokens
        if kind in (CLIPPED, MASKED) and short is not None:
            forwarded[kind] += short.tokens_after
        elif kind == KEPT:
            forwarded[kind] += tokens
    # Recalled turns are forwarded together, as one quoted block.
    forwarded[RECALLED] = recall.tokens if recall is not None else 0
    before, after = int(row.get("tokens_before") or 0), int(row.get("tokens_after") or 0)
    sent["other"] = before - sum(sent.values())
    forwarded["summary"] = summary_tokens or 0
    forwarded["other"] = after - sum(forwarded.values())
    return {"sent": sent, "forwarded": forwarded, "exact": exact}


def context_entries(
    row: Mapping[str, Any],
    chain: Sequence[StoredItem] | None,
    summarized: Sequence[int],
    summary: Mapping[str, Any] | None,
) -> list[dict[str, Any]]:
    """The request's conversation item by item, in the order it was forwarded.

    Every position sent is listed with its fate (a dropped or summarized
    message too: the list explains what the upstream did *not* see); the
    summary stands where the policy put it, before the first message it
    stands in for. The stored message is included when the chain is known.
    """
    detail: Mapping[str, Any] = row.get("detail") or {}
    recall = recall_of(detail)
    fate = fates(row, summarized, recall)
    block_at = _block_position(row, chain, recall)
    clipped, masked = clipped_by_index(detail), masked_by_index(detail)
    first_summarized = min(summarized) if summarized else None
    entries: list[dict[str, Any]] = []
    for index in range(int(row.get("messages_before") or 0)):
        if index == first_summarized and summary is not None:
            entries.append({"kind": "summary", **summary})
        if index == block_at and recall is not None:
            entries.append(_recall_entry(recall))
        item = chain[index] if chain is not None else None
        kind, reason = fate.get(index, (KEPT, None))
        short = clipped.get(index) or masked.get(index)
        tokens = item.token_count if item is not None else None
        if tokens is None and short is not None:
            tokens = short.tokens_before
        forwarded: int | None
        if kind in (DROPPED, SUMMARIZED, RECALLED):
            # A recalled message is forwarded inside the recall block, not on its own.
            forwarded = 0
        elif short is not None and kind in (CLIPPED, MASKED):
            forwarded = short.tokens_after
        else:
            forwarded = tokens
        entry: dict[str, Any] = {
            "kind": "message",
            "index": index,
            "fate": kind,
            "reason": reason,
            "item_id": item.id if item is not None else None,
            "role": item.role if item is not None else None,
            "tokens": tokens,
            "tokens_forwarded": forwarded,
            "message": item.message if item is not None else None,
        }
        if kind == RECALLED and recall is not None:
            hit = recall.hits.get(index)
            entry["score"] = hit[1] if hit else None
        entries.append(entry)
    if block_at is not None and block_at >= len(entries) and recall is not None:
        entries.append(_recall_entry(recall))
    return entries


def _block_position(
    row: Mapping[str, Any], chain: Sequence[StoredItem] | None, recall: RecallView | None
) -> int | None:
    """Where the recall block went: before the newest user message (the end if unknown)."""
    if recall is None or not recall.units:
        return None
    count = int(row.get("messages_before") or 0)
    if chain is not None:
        users = [i for i, item in enumerate(chain) if item.role == "user"]
        if users:
            return users[-1]
    return count


def _recall_entry(recall: RecallView) -> dict[str, Any]:
    return {
        "kind": "recall",
        "tokens": recall.tokens,
        "turns": len(recall.units),
        "indexes": recall.indexes,
    }
