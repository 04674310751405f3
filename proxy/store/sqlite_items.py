"""How the SQLite store lays out an item's row (migration 9) and its pages, and reads it back.

An item's two hashes are stored as their 16 bytes, not 32 hex digits (any other
string, which the store's contract allows for a content hash, stays text); its
``role`` and ``status`` are virtual generated columns (for queries by hand),
derived from what is stored: ``kind``, the role only where the message's JSON
has another or none (a Responses item's type), and ``incomplete`` (0 or 1,
which SQLite stores in no bytes). The store reads the stored columns and
derives the two itself: the generated ``role`` would parse the JSON again.
"""

from __future__ import annotations

from typing import Any

from proxy.store.base import Storable
from proxy.store.rows import dumps

# A new database's page size (an existing one keeps its own until a VACUUM after
# ``PRAGMA page_size``, with the proxy stopped). Rows of a message each (~1 KB of
# JSON) fill a page only in whole rows: four ~940-byte rows fill a 4 KB page and
# leave 10% of it empty, seventeen a 16 KB page (3%). The cost: a commit writes
# whole pages to the WAL, so a commit of one exchange alone takes ~0.1 ms more CPU
# (docs/design/long-sessions.md has the figures); group commit shares it out.
PAGE_SIZE = 16384


def hex_sql(column: str) -> str:
    """SQL for a hash column as the string it was given (see :func:`packed`)."""
    return f"CASE typeof({column}) WHEN 'blob' THEN lower(hex({column})) ELSE {column} END"


# The columns of an item as StoredItem has them (rows.item_from_row reads them; ``role``
# NULL: the message's own), from the table aliased ``items``.
ITEM_COLUMNS = f"""items.id, items.session_id, items.parent_id,
    {hex_sql("items.path_hash")} AS path_hash, {hex_sql("items.content_hash")} AS content_hash,
    items.kind AS role, items.token_count,
    CASE items.incomplete WHEN 0 THEN 'complete' ELSE 'incomplete' END AS status,
    items.message_json, items.created_at"""

INSERT_ITEM = """
    INSERT INTO items (session_id, parent_id, path_hash, content_hash, kind,
        token_count, incomplete, message_json, created_at, pos)
    VALUES (?, (SELECT id FROM items WHERE session_id = ? AND path_hash = ?),
        ?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (session_id, path_hash) DO NOTHING
"""

STATUSES = {"complete": 0, "incomplete": 1}


def packed(digest: str) -> bytes | str:
    """A hash as stored: 32 lowercase hex digits as their 16 bytes, anything else as given."""
    if len(digest) == 32:
        try:
            raw = bytes.fromhex(digest)
        except ValueError:
            return digest
        if raw.hex() == digest:
            return raw
    return digest


def insert_values(
    session_id: int, parent: str | None, path: str, item: Storable, now: float, pos: int
) -> tuple[Any, ...]:
    """INSERT_ITEM's parameters: ``parent`` and ``path`` are path hashes (hex)."""
    role = item.role
    kind = None if item.message.get("role") == role else role
    return (
        session_id,
        session_id,
        None if parent is None else packed(parent),
        packed(path),
        packed(item.content_hash),
        kind,
        item.token_count,
        STATUSES[item.status],  # anything else is a bug: KeyError, not a lost status
        dumps(item.message),
        now,
        pos,
    )
