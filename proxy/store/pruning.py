"""What ``DELETE /v1/responses/{id}`` deletes: the items only that response holds.

Items are shared: a chained response stores only its new input and output
after the chain it continues, and a resent history reuses every stored item.
So a response's chain (root to its last output item) is mostly other
responses' too. What only it holds is a *suffix* of that chain, found by
walking back from its last item and stopping at the first item that

- something else ends at (a *reference*): another response's last item or
  last input item, the last item or reply of any request row that is not the
  deleted response's own (chat requests, ``history: server`` turns), or the
  session's head when something else moved it there; or
- has a child besides the one the walk came from (a later branch hangs from it).

Everything before that item stays (it is on the way to what stopped the walk).
The deleted set is closed under descendants: no surviving item has a deleted
ancestor, so every surviving chain stays whole, and a cached chain whose last
item exists is whole too (the Redis store checks only that item).

Each store deletes, in the same transaction: the response's mapping row; its
own request rows (those whose ``detail.response_id`` names it, in its
session); the suffix's items with their recall index entries; the summaries
covering any of them (a summary of a chain includes that chain's text). The
session's head, if it was deleted, moves to the nearest surviving ancestor;
a session left with no items and no request rows is deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Collection


def exclusive_suffix(
    head: int | None,
    parent: Callable[[int], int | None],
    children: Callable[[int], int],
    references: Collection[int],
) -> list[int]:
    """Item ids only the chain ending at ``head`` holds, from ``head`` back (see the module).

    ``parent(id)``: the item's parent (None for a root); ``children(id)``: how
    many items have it as parent; ``references``: the ids something else ends at.
    """
    out: list[int] = []
    item = head
    while item is not None:
        if item in references or children(item) > (1 if out else 0):
            break
        out.append(item)
        item = parent(item)
    return out


def chain_up_sql(head: str, *, by_parent: bool = False) -> str:
    """A chain's items from ``head`` (a bound parameter) back to the root, each with
    its parent and how many children it has: (id, parent_id, children), head first.

    ``by_parent``: children found by their parent alone (an item id names one item
    in any session), for an index on ``parent_id`` (SQLite's) rather than on
    ``(session_id, parent_id)`` (PostgreSQL's).
    """
    same_session = "" if by_parent else "c.session_id = i.session_id AND "
    return f"""
    WITH RECURSIVE chain (id, depth) AS (
        SELECT {head}, 0
        UNION ALL
        SELECT items.parent_id, chain.depth + 1 FROM items JOIN chain ON items.id = chain.id
            WHERE items.parent_id IS NOT NULL
    )
    SELECT i.id, i.parent_id,
        (SELECT count(*) FROM items c WHERE {same_session}c.parent_id = i.id)
    FROM chain JOIN items i ON i.id = chain.id
    ORDER BY chain.depth
    """


def references_sql(session_id: str, tenant: str, key: str) -> str:
    """The items something else in the session ends at: remaining responses, request rows.

    Run after the response's own mapping and request rows are deleted."""
    return f"""
    SELECT head_item_id FROM responses WHERE session_id = {session_id}
    UNION SELECT input_head_item_id FROM responses WHERE session_id = {session_id}
    UNION SELECT last_item_id FROM requests WHERE tenant = {tenant} AND session_key = {key}
    UNION SELECT reply_item_id FROM requests WHERE tenant = {tenant} AND session_key = {key}
    """
