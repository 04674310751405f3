"""Runs a route's policy over a request: budget, token counter, decision."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.apply import apply
from policies.trim import budget_limit
from policies.types import Budget, ContextTooLong, Decision, Message, PolicySpec, TrimSpec
from proxy.errors import ContextLengthExceeded
from proxy.model_info import context_window
from proxy.tokens import counter_for


def reserved_for_answer(body: Mapping[str, Any]) -> int:
    """Tokens the request asks to keep for the answer (max_completion_tokens / max_tokens)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


class Rewriter:
    def __init__(self, policies: Mapping[str, PolicySpec]) -> None:
        self._policies = policies

    def needs_model_info(self) -> bool:
        return any(
            isinstance(p, TrimSpec) and p.context_fraction is not None
            for p in self._policies.values()
        )

    def decide(
        self, policy: str, messages: Sequence[Message], body: Mapping[str, Any], model: str
    ) -> Decision:
        spec = self._policies[policy]
        counter = counter_for(model)
        limit: int | None = None
        if isinstance(spec, TrimSpec):
            window = context_window(model) if spec.context_fraction is not None else None
            limit = budget_limit(spec, window, reserved_for_answer(body))
        budget = Budget(limit=limit, fixed=counter.count_request_fixed(body))
        try:
            return apply(messages, spec, counter.count_message, budget)
        except ContextTooLong as exc:
            raise ContextLengthExceeded(
                f"{exc} Shorten the newest turn or raise the policy's budget.",
                param="messages",
            ) from exc
