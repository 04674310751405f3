"""The stored chain a ``previous_response_id`` continues, from the session's cached chain.

Each turn of an agent on the Responses API names the response before it,
and the proxy replays that response's whole chain. Read by walking it in
the store, every item parsed again, a turn cost more the longer the
conversation (a 2,000-item chain: ~20 ms). The store keeps each session's
chain last read, checked against the session's head on every read (see
proxy/store/sqlite_history.py and its PostgreSQL and Redis peers). Items
are never rewritten, so the chain to a response's last item is the prefix
of any chain through that item: when the session's chain holds it (the
usual case, the response before is the session's last), that prefix is
the answer; otherwise (a turn from an older response: a branch) the
store walks it as before.
"""

from __future__ import annotations

from proxy.store.base import SessionRef, Store, StoredItem, StoredResponse


async def previous_chain(store: Store, previous: StoredResponse) -> list[StoredItem]:
    """The items ``previous`` ends, root first (the caller's own copies)."""
    head = previous.head_item_id
    if head is not None:
        chain = await store.history(SessionRef(previous.tenant, previous.session_key))
        for end in range(len(chain) - 1, -1, -1):  # the response is usually the last
            if chain[end].id == head:
                return chain[: end + 1]
    return await store.response_chain(previous.tenant, previous.id)
