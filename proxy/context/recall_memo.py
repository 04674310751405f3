"""What recall brought back for a session's last request, for the same request again.

A client resending a request (a retry, a regenerated answer, a client that
resends whole histories without a new turn) over a session whose stored
items did not change since gets what the last one got: the search, the
choice of units and the block's quoting and count are all functions of

- the session's stored items: their version (proxy/store/item_versions.py;
  None, unknown, memoizes nothing), which covers the index;
- the conversation: its messages' content hashes in order (the query, the
  system prompt's words, the hits' check and the quoted lines' text, role
  and name are in them); the recalled messages themselves are compared too
  (a line also quotes a time, which the hash leaves out);
- the policy's decision as recall reads it (what it dropped and repaired,
  its token counts), the recall budget, the recall spec and the model (the
  token counter).

Lexical recall only: semantic recall also reads the session's vectors,
which the background embedder adds on its own schedule.

One entry per session (its last recall), least recently used first out,
bounded by sessions and by bytes (the key's hashes and the block's text).
Entries are shared: the block is copied for each request.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from policies.recall import Recalled
from policies.types import Decision, Message, RecallSpec
from proxy.store.base import SessionRef
from proxy.store.sized import SizedCache, SizedLRU

SESSIONS = 1024
MAX_BYTES = 16 * 2**20


@dataclass(frozen=True)
class RecallResult:
    """A recall step's result, as a later identical request takes it."""

    recalled: Recalled
    status: str
    terms: int
    candidates: int
    semantic: str | None
    # The block message and what it quotes (nothing recalled: None and ()), and
    # the position of the newest user message it goes before.
    block: Message | None = None
    sources: tuple[Message, ...] = ()
    newest: int = -1

    def applied(self, decision: Decision, messages: Sequence[Message]) -> Decision | None:
        """``decision`` (the policy's, for ``messages``) with the block; None when this
        result does not hold for them."""
        at = self.recalled.position
        if self.block is None or at is None:
            return decision
        spans = self.recalled.spans
        quoted = tuple(messages[i] for start, end in spans for i in range(start, end))
        forwarded = decision.messages
        if (
            quoted != self.sources
            or not (0 <= self.newest < len(messages) and 0 <= at < len(forwarded))
            or forwarded[at] is not messages[self.newest]
        ):
            return None
        block = dict(self.block)  # the forwarded list is the request's own
        return decision.but(
            messages=[*forwarded[:at], block, *forwarded[at:]],
            tokens_after=decision.tokens_after + self.recalled.tokens,
        )


def result_of(
    recalled: Recalled,
    decision: Decision,
    messages: Sequence[Message],
    *,
    status: str,
    terms: int,
    candidates: int,
    semantic: str | None,
) -> RecallResult:
    """What to memoize of a recall step that turned the policy's list into ``decision``."""
    at = recalled.position
    if at is None or not recalled.spans:
        return RecallResult(recalled, status, terms, candidates, semantic)
    newest = next(
        (i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "user"), -1
    )
    quoted = tuple(messages[i] for start, end in recalled.spans for i in range(start, end))
    return RecallResult(
        recalled,
        status,
        terms,
        candidates,
        semantic,
        block=decision.messages[at],
        sources=quoted,
        newest=newest,
    )


class RecallMemo(SizedCache[tuple[str, str], tuple[Hashable, RecallResult]]):
    def __init__(self, max_sessions: int = SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self._entries: SizedLRU[tuple[str, str], tuple[Hashable, RecallResult]] = SizedLRU(
            max_sessions, max_bytes
        )

    @staticmethod
    def key(
        version: int,
        spec: RecallSpec,
        budget: int,
        model: str,
        hashes: Sequence[str],
        decision: Decision,
    ) -> Hashable:
        return (
            version,
            spec,
            budget,
            model,
            tuple(hashes),
            decision.dropped,
            decision.repaired,
            decision.tokens_before,
            decision.tokens_after,
        )

    def get(self, ref: SessionRef, key: Hashable) -> RecallResult | None:
        found = self._entries.get((ref.tenant, ref.key))
        if found is None or found[0] != key:
            return None
        self._entries.touch((ref.tenant, ref.key))
        return found[1]

    def put(self, ref: SessionRef, key: Hashable, result: RecallResult, hashes: int) -> None:
        text = result.block.get("content") if result.block is not None else None
        # The key's hashes and dropped positions (references), the block's text.
        size = 256 + 16 * hashes + (len(text) if isinstance(text, str) else 0)
        self._entries.put((ref.tenant, ref.key), (key, result), size)
