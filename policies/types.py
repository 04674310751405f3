"""Values shared by every policy: messages, specs, budgets and decisions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

# A chat message exactly as the client sent it (parsed JSON). Policies never
# mutate one; a clipped tool result is a new dict.
Message = Mapping[str, Any]

# Tokens one message costs in a request, per-message overhead included.
CountFn = Callable[[Message], int]


@dataclass(frozen=True)
class NoneSpec:
    """`strategy: none`: forward the conversation exactly as it came."""

    strategy: Literal["none"] = "none"


@dataclass(frozen=True)
class TrimSpec:
    """`strategy: trim`: keep the last turns that fit the limits."""

    max_turns: int | None = None
    max_tokens: int | None = None
    # Share of the model's context window; the proxy turns it into tokens.
    context_fraction: float | None = None
    # When trimming is needed, cut down to this share of the budget (hysteresis).
    low_water: float | None = None
    tool_output_max_tokens: int | None = None
    strategy: Literal["trim"] = "trim"


PolicySpec = NoneSpec | TrimSpec


@dataclass(frozen=True)
class Budget:
    """The token budget a request must fit, computed by the caller.

    ``limit`` is the budget for the message list (None: no token limit);
    ``fixed`` is what the request costs besides its messages (tool
    definitions, reply priming) and counts against ``limit``.
    """

    limit: int | None = None
    fixed: int = 0


@dataclass(frozen=True)
class Clip:
    """A tool result shortened to fit: head and tail kept, a marker between."""

    index: int
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True)
class Decision:
    """What a policy did to one request: a value the proxy logs, stores and shows.

    Indexes refer to positions in the list the policy received.
    """

    messages: list[Message]
    kept: tuple[int, ...]
    dropped: tuple[int, ...] = ()
    # Orphans removed to keep tool calls and results paired (subset of dropped).
    repaired: tuple[int, ...] = ()
    clipped: tuple[Clip, ...] = ()
    turns_dropped: int = 0
    # Which limit caused the drop: "max_turns", "max_tokens", "orphan", or None.
    reason: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    budget: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.clipped)


class ContextTooLong(Exception):
    """System messages plus the newest turn cannot fit the budget."""

    def __init__(self, needed: int, budget: int) -> None:
        super().__init__(
            f"This request needs {needed} tokens after trimming, but the context "
            f"budget is {budget} tokens."
        )
        self.needed = needed
        self.budget = budget
