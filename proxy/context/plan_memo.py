"""Each session's last summary plan, for the same request again (a resent history),
and stored summaries as plans take them.

A summarize policy plans every request: the units and their costs, the best
stored summary, the view and its trimming; after the answer, the plan for
the request that may come next (the prefetch). Both are pure functions of
the conversation (its path hash: every message's content hash, in order),
the stored summaries covering it, the spec, the budget and the model (the
token counter): a request identical in those is planned as the last one was.

Memoized: a plan that forwards a view (none to make; a plan that has a
summary made is not), without clipped or masked messages (those are copies
of the request's); the view as the positions of the request's own messages
it forwards, the summary messages copied for each request; and a prefetch
that found no summary to make. One entry of each per session, least
recently used first out, bounded by sessions and by bytes.

A session under any other policy (trim, passthrough) keeps its last decision
in the same slot (``Rewriter.decide``): its key names the policy and holds the
messages' hashes and counts, so it never equals a summary plan's.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from operator import is_
from typing import Any

from policies.facts import facts_from_json
from policies.types import Budget, Decision, Message, SummarizeSpec, SummaryState
from proxy.store.base import SessionRef, StoredSummary
from proxy.store.sized import SizedLRU

SESSIONS = 1024
MAX_BYTES = 16 * 2**20
# Stored summaries kept as plans take them (a summary and its facts each).
STATES = 1024


def summary_state(stored: StoredSummary, covers: int) -> SummaryState:
    """A stored summary as a plan of a conversation takes it: ``covers`` its first messages."""
    facts = facts_from_json(stored.facts)
    return SummaryState(covers, stored.start_unit, stored.text, facts, stored.id)


class StoredStates:
    """Plan states of stored summaries, made once per (summary, position): a summary never
    changes once stored, and the facts need not be parsed from JSON on every request."""

    def __init__(self, max_entries: int = STATES) -> None:
        self.max_entries = max_entries
        self._seen: OrderedDict[tuple[int, int], SummaryState] = OrderedDict()

    def states(self, stored: Sequence[StoredSummary], paths: Sequence[str]) -> list[SummaryState]:
        """``stored`` (summaries covering a prefix of ``paths``) as plan states."""
        if not stored:
            return []
        position = {h: i for i, h in enumerate(paths)}
        return [self._state(s, position[s.covers_path_hash] + 1) for s in stored]

    def _state(self, stored: StoredSummary, covers: int) -> SummaryState:
        key = (stored.id, covers)
        state = self._seen.get(key)
        if state is None:
            state = self._seen[key] = summary_state(stored, covers)
            while len(self._seen) > self.max_entries:
                self._seen.popitem(last=False)
        return state


def plan_key(
    path: str,
    n: int,
    spec: SummarizeSpec,
    budget: Budget,
    model: str,
    states: Sequence[SummaryState],
) -> Hashable:
    """What a plan of ``n`` messages ending at ``path`` depends on. Compared, never hashed
    (the memo is by session): the spec is the same object from request to request."""
    return (path, n, spec, budget, model, tuple((s.id, s.covers) for s in states))


@dataclass(frozen=True)
class PlannedView:
    """A plan's decision with the request's messages as their positions."""

    decision: Decision  # its messages left out (the template says them)
    template: tuple[int | Message, ...]
    status: str
    summary_id: int | None

    @staticmethod
    def of(
        decision: Decision, messages: Sequence[Message], status: str, summary_id: int | None
    ) -> PlannedView | None:
        if decision.clipped or decision.masked:
            return None
        kept, forwarded = decision.kept, decision.messages
        template: tuple[int | Message, ...]
        if len(kept) == len(forwarded) and all(
            map(is_, forwarded, map(messages.__getitem__, kept))
        ):
            # The usual decision: the messages kept, as they are, in order (checked in C).
            template = kept
        else:
            where = {id(m): i for i, m in enumerate(messages)}
            template = tuple(where.get(id(m), m) for m in forwarded)
        return PlannedView(dataclasses.replace(decision, messages=[]), template, status, summary_id)

    def decision_for(self, messages: Sequence[Message]) -> Decision:
        """The decision for ``messages`` (the request the key was made of)."""
        forwarded = [messages[t] if isinstance(t, int) else dict(t) for t in self.template]
        extra = {k: _copied(v) for k, v in self.decision.extra.items()}
        return self.decision.but(messages=forwarded, extra=extra)

    @property
    def size(self) -> int:
        text = sum(len(str(t.get("content"))) for t in self.template if not isinstance(t, int))
        return 512 + 8 * len(self.template) + text


def _copied(value: Any) -> Any:
    return {k: _copied(v) for k, v in value.items()} if isinstance(value, dict) else value


class PlanMemo:
    def __init__(self, max_sessions: int = SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self._views: SizedLRU[tuple[str, str], tuple[Hashable, PlannedView]] = SizedLRU(
            max_sessions, max_bytes
        )
        # A prefetch's key that found nothing to make.
        self._idle: SizedLRU[tuple[str, str], Hashable] = SizedLRU(max_sessions, max_bytes // 16)

    @property
    def max_bytes(self) -> int:
        """The views' bytes and the idle keys' (a sixteenth of it)."""
        return self._views.max_bytes + self._idle.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._idle.max_bytes = value // 16
        self._views.max_bytes = value - value // 16

    def view(self, ref: SessionRef, key: Hashable) -> PlannedView | None:
        found = self._views.get((ref.tenant, ref.key))
        if found is None or found[0] != key:
            return None
        self._views.touch((ref.tenant, ref.key))
        return found[1]

    def remember_view(self, ref: SessionRef, key: Hashable, view: PlannedView) -> None:
        self._views.put((ref.tenant, ref.key), (key, view), view.size)

    def idle(self, ref: SessionRef, key: Hashable) -> bool:
        """Whether a prefetch of this key found no summary to make."""
        return self._idle.get((ref.tenant, ref.key)) == key

    def remember_idle(self, ref: SessionRef, key: Hashable) -> None:
        self._idle.put((ref.tenant, ref.key), key, 256)
