"""Runs a route's policy over a request: budget, token counter, decision."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from policies.apply import apply
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
from proxy.context.tokens import counter_for
from proxy.errors import ContextLengthExceeded


def reserved_for_answer(body: Mapping[str, Any]) -> int:
    """Tokens the request asks to keep for the answer (max_completion_tokens / max_tokens)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _uncalibrated(model: str) -> float:
    return 1.0


class Rewriter:
    def __init__(
        self,
        policies: Mapping[str, PolicySpec],
        calibration: Callable[[str], float] = _uncalibrated,
    ) -> None:
        self._policies = policies
        # Upstream tokens per local token for a model (proxy.calibration).
        self._calibration = calibration

    def needs_model_info(self) -> bool:
        return any(
            isinstance(p, TrimSpec) and p.context_fraction is not None
            for p in self._policies.values()
        )

    def decide(
        self,
        policy: str,
        messages: Sequence[Message],
        body: Mapping[str, Any],
        model: str,
        keys: Sequence[str] | None = None,
        *,
        counts: Sequence[int] | None = None,
    ) -> Decision:
        """The policy's decision for one request.

        ``keys``: content hashes of ``messages`` when the caller has them
        (sessions do), so token counts are looked up without hashing again;
        ``counts``: the counts themselves, when the caller has those too.
        """
        spec = self._policies[policy]
        budget, factor = self.budget(spec, body, model)
        count = self.counter(messages, model, keys, counts)
        try:
            decision = apply(messages, spec, count, budget)
        except ContextTooLong as exc:
            raise ContextLengthExceeded(
                f"{exc} Shorten the newest turn or raise the policy's budget.",
                param="messages",
            ) from exc
        if factor != 1.0:
            decision = dataclasses.replace(
                decision, extra={**decision.extra, "calibration": factor}
            )
        return decision

    def spec(self, policy: str) -> PolicySpec:
        return self._policies[policy]

    def budget(self, spec: PolicySpec, body: Mapping[str, Any], model: str) -> tuple[Budget, float]:
        """The budget ``spec`` runs with for this request, and the calibration factor applied."""
        counter = counter_for(model)
        limit: int | None = None
        if isinstance(spec, TrimSpec):
            window = context_window(model) if spec.context_fraction is not None else None
            limit = budget_limit(spec, window, reserved_for_answer(body))
        elif isinstance(spec, SummarizeSpec):
            limit = limit_of(spec)
        factor = self._calibration(model) if limit is not None else 1.0
        if limit is not None and factor != 1.0:
            # The budget is in the upstream's tokens; the counts are local: convert
            # the budget, so counts stay what tiktoken says (and calibration stable).
            limit = int(limit / factor)
        return Budget(limit=limit, fixed=counter.count_request_fixed(body)), factor

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
            known = {id(m): n for m, n in zip(messages, counts, strict=True)}

            def counted(message: Message) -> int:
                n = known.get(id(message))
                # Messages the policy made itself (clipped copies, summaries) are counted now.
                return counter.count_message(message) if n is None else n

            return counted
        by_id = {} if keys is None else {id(m): k for m, k in zip(messages, keys, strict=True)}

        def count(message: Message) -> int:
            # Messages the policy made itself (clipped copies, summaries) have no key.
            return counter.count_message(message, by_id.get(id(message)))

        return count
