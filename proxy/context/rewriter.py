"""Runs a route's policy over a request: budget, token counter, decision."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from policies.apply import apply
from policies.recall import recall_budget, reserve
from policies.summarize import limit_of
from policies.trim import budget_limit
from policies.types import (
    Budget,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    PolicySpec,
    SummarizeSpec,
    TrimSpec,
)
from proxy.context.model_info import context_window
from proxy.context.plan_memo import PlanMemo, PlannedView
from proxy.context.tokens import counter_for
from proxy.errors import ContextLengthExceeded
from proxy.store.base import SessionRef


def needs_window(spec: PolicySpec) -> bool:
    """Whether the policy's budget is a share of the model's context window."""
    return isinstance(spec, TrimSpec) and spec.context_fraction is not None


def reserved_for_answer(body: Mapping[str, Any]) -> int:
    """Tokens the request asks to keep for the answer (max_completion_tokens / max_tokens)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _uncalibrated(model: str, upstream: str | None = None) -> float:
    return 1.0


def _mapped_window(model: str, upstream: str | None = None) -> int | None:
    return context_window(model)


def conversation_tokens(
    spec: PolicySpec,
    messages: Sequence[Message],
    count: CountFn,
    counts: Sequence[int] | None = None,
) -> int | None:
    """The conversation's tokens when ``spec`` recalls (for :meth:`Rewriter.budget`); else None.

    ``counts``: the messages' counts, when known (summed, no message counted one by one)."""
    if getattr(spec, "recall", None) is None:
        return None
    if counts is not None:
        return sum(counts)
    return sum(count(m) for m in messages)


def _too_long(exc: ContextTooLong) -> ContextLengthExceeded:
    return ContextLengthExceeded(
        f"{exc} Shorten the newest turn or raise the policy's budget.", param="messages"
    )


class Rewriter:
    def __init__(
        self,
        policies: Mapping[str, PolicySpec],
        calibration: Callable[[str, str | None], float] = _uncalibrated,
        windows: Callable[[str, str | None], int | None] = _mapped_window,
    ) -> None:
        self._policies = policies
        # A model's context window behind an upstream (proxy.context.windows).
        self._windows = windows
        # Upstream tokens per local token for a model through an upstream (proxy.calibration).
        self._calibration = calibration

    def needs_model_info(self) -> bool:
        return any(needs_window(p) for p in self._policies.values())

    def decide(
        self,
        policy: str,
        messages: Sequence[Message],
        body: Mapping[str, Any],
        model: str,
        keys: Sequence[str] | None = None,
        *,
        counts: Sequence[int] | None = None,
        memo: PlanMemo | None = None,
        ref: SessionRef | None = None,
        upstream: str | None = None,
    ) -> Decision:
        """The policy's decision for one request.

        ``keys``: content hashes of ``messages`` when the caller has them
        (sessions do), so token counts are looked up without hashing again;
        ``counts``: the counts themselves, when the caller has those too.
        ``memo`` and ``ref``: the session's last decision is reused when this
        request is the same again (a resent history, a retry): the decision is a
        pure function of the messages (their hashes), their counts, the spec, the
        budget and the model, so an equal key is an equal decision.
        """
        spec = self._policies[policy]
        count = self.counter(messages, model, keys, counts)
        tokens = conversation_tokens(spec, messages, count, counts)
        budget, factor = self.budget(spec, body, model, tokens=tokens, upstream=upstream)
        if memo is None or ref is None or keys is None or counts is None:
            return self._decide(messages, spec, count, budget, factor, counts)
        # Compared, never hashed; the spec is the same object from request to request.
        key = ("decide", policy, spec, model, budget, factor, tuple(keys), tuple(counts))
        view = memo.view(ref, key)
        if view is not None:
            return view.decision_for(messages)
        decision = self._decide(messages, spec, count, budget, factor, counts)
        planned = PlannedView.of(decision, messages, "", None)
        if planned is not None:
            memo.remember_view(ref, key, planned)
        return decision

    def _decide(
        self,
        messages: Sequence[Message],
        spec: PolicySpec,
        count: CountFn,
        budget: Budget,
        factor: float,
        costs: Sequence[int] | None = None,
    ) -> Decision:
        retried = False
        try:
            decision = apply(messages, spec, count, budget, costs)
        except ContextTooLong as exc:
            if not budget.recall or budget.limit is None:
                raise _too_long(exc) from exc
            # Only the recall reserve made it too long: decide with the whole
            # budget, and recall gets what is left (often nothing).
            whole = budget.limit + budget.recall
            try:
                decision = apply(messages, spec, count, Budget(whole, budget.fixed), costs)
            except ContextTooLong as again:
                raise _too_long(again) from again
            room, retried = max(0, whole - decision.tokens_after), True
        else:
            room = recall_budget(budget, decision)
        if factor != 1.0 or room or retried:
            extra = dict(decision.extra)
            if factor != 1.0:
                extra["calibration"] = factor
            if room or retried:
                extra["recall_budget"] = room
            decision = decision.but(extra=extra)
        return decision

    def spec(self, policy: str) -> PolicySpec:
        return self._policies[policy]

    def budget(
        self,
        spec: PolicySpec,
        body: Mapping[str, Any],
        model: str,
        *,
        tokens: int | None = None,
        upstream: str | None = None,
    ) -> tuple[Budget, float]:
        """The budget ``spec`` runs with for this request, and the calibration factor applied.

        ``tokens``: the conversation's count (:func:`conversation_tokens`), when
        known; ``upstream``: where the request goes (calibration is per upstream). A
        conversation that fits the whole budget keeps all of it: the recall reserve is
        not taken off (``Budget.spare`` instead), so a policy with recall drops nothing
        earlier than the same policy without.
        """
        counter = counter_for(model)
        limit: int | None = None
        if isinstance(spec, TrimSpec):
            window = self._windows(model, upstream) if spec.context_fraction is not None else None
            limit = budget_limit(spec, window, reserved_for_answer(body))
        elif isinstance(spec, SummarizeSpec):
            limit = limit_of(spec)
        factor = self._calibration(model, upstream) if limit is not None else 1.0
        if limit is not None and factor != 1.0:
            # The budget is in the upstream's tokens; the counts are local: convert
            # the budget, so counts stay what tiktoken says (and calibration stable).
            limit = int(limit / factor)
        held = 0
        fixed = counter.count_request_fixed(body)
        recall_spec = getattr(spec, "recall", None)
        if recall_spec is not None:
            held = reserve(recall_spec, limit)
            if limit is not None and tokens is not None and tokens + fixed <= limit:
                return Budget(limit=limit, fixed=fixed, spare=held), factor
            if limit is not None:
                # The kept window shrinks to make room for the recalled turns.
                limit -= held
        return Budget(limit=limit, fixed=fixed, recall=held), factor

    @staticmethod
    def counter(
        messages: Sequence[Message],
        model: str,
        keys: Sequence[str] | None = None,
        counts: Sequence[int] | None = None,
    ) -> CountFn:
        """Token counts for ``messages`` (by their content hashes, or as ``counts``, when
        given) and for any other message."""
        counter = counter_for(model)
        if counts is not None:
            if len(counts) != len(messages):
                raise ValueError(f"{len(counts)} counts for {len(messages)} messages")
            # Built on the first message counted one at a time: a policy given the
            # counts as a list (``apply(..., costs)``) may never ask.
            known: dict[int, int] = {}

            def counted(message: Message) -> int:
                if not known:
                    known.update(zip(map(id, messages), counts, strict=True))
                n = known.get(id(message))
                # Messages the policy made itself (clipped copies, summaries) are counted now.
                return counter.count_message(message) if n is None else n

            return counted
        by_id = {} if keys is None else {id(m): k for m, k in zip(messages, keys, strict=True)}
        # A policy counts each message several times (a summarize policy's plan and
        # its prefetch: ~3 times per message): the request's own messages, alive as
        # long as this counter, are counted once; the policy's own copies each time
        # (their ids may be reused once they are gone).
        memo: dict[int, int] = {}

        def count(message: Message) -> int:
            i = id(message)
            n = memo.get(i)
            if n is not None:
                return n
            key = by_id.get(i)
            # Messages the policy made itself (clipped copies, summaries) have no key.
            n = counter.count_message(message, key)
            if key is not None:
                memo[i] = n
            return n

        return count
