"""Each session's last path hashes: the prefix a request resends is not hashed again.

A summarize policy finds its stored summaries by the path hash of each
message (its content hash chained to its ancestors': proxy/store/base.py),
one blake2b per message per request. A session's next request resends the
last one's history and appends to it, so its path hashes are the last
request's for the common prefix, and only the messages after it are hashed.

A pure memo: every list returned is what ``chain_path_hashes`` gives (a
path hash depends only on the content hashes up to it). One entry per
session, least recently used first out, bounded by sessions and by bytes
(each message's content hash reference and path hash string).
"""

from __future__ import annotations

from collections.abc import Sequence

from proxy.store.base import SessionRef, path_hash
from proxy.store.sized import SizedCache, SizedLRU

SESSIONS = 1024
MAX_BYTES = 16 * 2**20
# A path hash string (32 hex digits) and two list slots.
ENTRY_BYTES = 96


class ChainPaths(SizedCache[tuple[str, str], tuple[list[str], list[str]]]):
    def __init__(self, max_sessions: int = SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self._entries: SizedLRU[tuple[str, str], tuple[list[str], list[str]]] = SizedLRU(
            max_sessions, max_bytes
        )

    def of(self, ref: SessionRef, hashes: Sequence[str]) -> list[str]:
        """The path hashes of ``hashes`` (content hashes from the root), a new list."""
        key = (ref.tenant, ref.key)
        found = self._entries.get(key)
        known: list[str] = []
        if found is not None:
            before, paths = found
            n = len(before)
            if n <= len(hashes) and before == hashes[:n]:
                known = paths  # the common case: the last history, then what is new
            else:
                known = paths[: _common(before, hashes)]
        out = list(known[: len(hashes)])
        parent = out[-1] if out else None
        for content_hash in hashes[len(out) :]:
            parent = path_hash(parent, content_hash)
            out.append(parent)
        self._entries.put(key, (list(hashes), out[:]), 256 + ENTRY_BYTES * len(out))
        return out


def _common(a: Sequence[str], b: Sequence[str]) -> int:
    """The length of the longest common prefix of ``a`` and ``b``."""
    for k, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return k
    return min(len(a), len(b))
