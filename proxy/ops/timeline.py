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

from proxy.store.base import StoredItem

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


def recalled_entries(detail: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The turns recall brought back, as ``{"index", "score", "tokens"}`` (score may be None).

    Read from ``detail["recalled"]`` or ``detail["recall"]["recalled"]``: a list
    of positions or of objects naming ``index`` (or ``position``) and ``score``.
    """
    raw: object = detail.get("recalled")
    recall = detail.get("recall")
    if raw is None and isinstance(recall, Mapping):
        raw = recall.get("recalled") or recall.get("items")
    if not isinstance(raw, Sequence) or isinstance(raw, str | bytes):
        return []
    out: list[dict[str, Any]] = []
    for entry in raw:
        index = _index(entry)
        if index is None:
            continue
        tokens = _number(entry, "tokens", "token_count")
        out.append(
            {
                "index": index,
                "score": _number(entry, "score"),
                "tokens": None if tokens is None else int(tokens),
            }
        )
    return out


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
    row: Mapping[str, Any], summarized: Sequence[int], recalled: Sequence[int]
) -> dict[int, tuple[str, str | None]]:
    """Each position's fate and, for a dropped one, why (positions not listed were kept)."""
    detail: Mapping[str, Any] = row.get("detail") or {}
    out: dict[int, tuple[str, str | None]] = {}
    repaired = set(detail.get("repaired", []))
    for index in row.get("dropped_indexes", []):
        out[index] = (DROPPED, "orphan" if index in repaired else row.get("reason"))
    for index in masked_by_index(detail):
        out[index] = (MASKED, None)
    for index in clipped_by_index(detail):
        out[index] = (CLIPPED, None)
    for index in summarized:
        out[index] = (SUMMARIZED, None)
    for index in recalled:
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
    recalled = recalled_entries(detail)
    fate = fates(row, summarized, [r["index"] for r in recalled])
    clipped, masked = clipped_by_index(detail), masked_by_index(detail)
    recalled_tokens = {r["index"]: r["tokens"] for r in recalled}
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
            tokens = short.tokens_before if short else recalled_tokens.get(index)
            if tokens is None:
                exact = False
                continue
        sent[kind] += tokens
        if kind in (CLIPPED, MASKED) and short is not None:
            forwarded[kind] += short.tokens_after
        elif kind in (KEPT, RECALLED):
            forwarded[kind] += tokens
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
    recalled = {r["index"]: r for r in recalled_entries(detail)}
    fate = fates(row, summarized, list(recalled))
    clipped, masked = clipped_by_index(detail), masked_by_index(detail)
    first_summarized = min(summarized) if summarized else None
    entries: list[dict[str, Any]] = []
    for index in range(int(row.get("messages_before") or 0)):
        if index == first_summarized and summary is not None:
            entries.append({"kind": "summary", **summary})
        item = chain[index] if chain is not None else None
        kind, reason = fate.get(index, (KEPT, None))
        short = clipped.get(index) or masked.get(index)
        tokens = item.token_count if item is not None else None
        if tokens is None and short is not None:
            tokens = short.tokens_before
        forwarded: int | None
        if kind in (DROPPED, SUMMARIZED):
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
        if kind == RECALLED:
            entry["score"] = recalled[index]["score"]
        entries.append(entry)
    return entries
