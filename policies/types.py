"""Values shared by every policy: messages, specs, budgets and decisions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from policies.facts import Fact

# A chat message exactly as the client sent it (parsed JSON). Policies never
# mutate one; a clipped tool result is a new dict.
Message = Mapping[str, Any]

# Tokens one message costs in a request, per-message overhead included.
CountFn = Callable[[Message], int]


@dataclass(frozen=True)
class MaskSpec:
    """`mask_tool_outputs`: old tool results replaced by a placeholder, in steps.

    See :mod:`policies.mask`.
    """

    # Results in the last N turns are never masked (N >= 1).
    after_turns: int = 4
    # Results shorter than this stay as they are.
    min_tokens: int = 200
    # The horizon moves when this many tokens of old-enough results await masking.
    step_tokens: int = 2048


@dataclass(frozen=True)
class NoneSpec:
    """`strategy: none`: forward the conversation exactly as it came (masking aside)."""

    mask_tool_outputs: MaskSpec | None = None
    strategy: Literal["none"] = "none"


# The fusion weight recall uses unless a policy says (bench/recall.py measured it).
SEMANTIC_WEIGHT = 0.4


@dataclass(frozen=True)
class RecallSpec:
    """A policy's ``recall:`` block: evicted turns brought back (see :mod:`policies.recall`)."""

    # The recall block's budget in tokens; or ``share`` of the policy's budget.
    max_tokens: int | None = None
    share: float | None = None
    # How far (in units) each hit lends its score to the units around it.
    neighbors: int = 2
    # "none": lexical search; "wordllama": lexical and semantic, fused.
    embeddings: str = "none"
    # Hits the index is asked for (the nearest vectors: proxy/context/recall.py).
    candidates: int = 40
    # The semantic share of the fused score (policies/fusion.py); measured in bench/recall.py.
    semantic_weight: float = SEMANTIC_WEIGHT
    # Lexical recall searches again with the words of its best hits (proxy/context/recall.py).
    expand: bool = False


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
    recall: RecallSpec | None = None
    # Old tool output replaced by a placeholder before trimming (policies.mask).
    mask_tool_outputs: MaskSpec | None = None
    strategy: Literal["trim"] = "trim"


@dataclass(frozen=True)
class SummarizerSpec:
    """Who writes a summary and how long it may be (``summarizer:`` of a summarize policy)."""

    # None: the request's own model (and the route's upstream).
    model: str | None = None
    # None: the route's upstream.
    upstream: str | None = None
    max_tokens: int = 400
    # The summarizer's instructions; None: the built-in structured prompt. The
    # proxy reads ``prompt_file`` at config load, so the text is all a policy sees.
    prompt: str | None = None
    prompt_file: str | None = None
    timeout_s: float = 20.0
    # Input tokens the summarizer model reads; None: the model's known window (unknown:
    # no limit). A range past it is summarized in chunks (proxy/context/summary_chunks.py).
    context_window: int | None = None


@dataclass(frozen=True)
class SummarizeSpec:
    """`strategy: summarize`: older turns folded into a stored, incremental summary.

    The history *passes the trigger* when the turns forwarded verbatim exceed
    ``trigger_turns`` or the forwarded tokens exceed ``trigger_tokens``; the
    turns before the last ``keep_last_turns`` (and after the first
    ``keep_first_turns``) are then summarized. See :mod:`policies.summarize`.
    """

    trigger_turns: int | None = None
    trigger_tokens: int | None = None
    # None: as many of the newest turns as fit ``low_water`` of the token budget.
    keep_last_turns: int | None = 3
    # Turns at the start kept verbatim too (the task statement); the summary
    # covers the middle. 0: the summary covers everything before the kept turns.
    keep_first_turns: int = 0
    # The budget every forwarded list must fit (the trimming fallback's too);
    # None: trigger_tokens, or no token limit.
    max_tokens: int | None = None
    # A new summary leaves the kept turns within this share of the budget, so
    # the next ones fit without summarizing again at once (hysteresis).
    low_water: float = 0.7
    # The summary (with its pinned facts) may use at most this share of the budget.
    summary_share: float | None = None
    tool_output_max_tokens: int | None = None
    summarizer: SummarizerSpec = SummarizerSpec()
    placement: Literal["system", "pair"] = "system"
    # Prepare the next summary in the background once the history is this
    # close to the trigger (a share of trigger_tokens; turns: one turn away).
    prefetch: bool = True
    prefetch_margin: float = 0.15
    recall: RecallSpec | None = None
    strategy: Literal["summarize"] = "summarize"


PolicySpec = NoneSpec | TrimSpec | SummarizeSpec


@dataclass(frozen=True)
class SummaryState:
    """A stored summary as this conversation sees it."""

    # Where the units it covers end: the index of the first message after them.
    covers: int
    start_unit: int
    text: str
    facts: tuple[Fact, ...] = ()
    id: int | None = None


@dataclass(frozen=True)
class SummaryTask:
    """A summary to make: the units ``[start_unit, cut_unit)``, messages ``[start, end)``."""

    start_unit: int
    cut_unit: int
    start: int
    end: int
    # Messages new to this summary (all of the range, or those after ``previous``).
    source: tuple[int, ...]
    previous: SummaryState | None
    # The pinned facts the new summary carries: the previous ones and the source's.
    facts: tuple[Fact, ...]
    # The summarizer's answer budget.
    max_tokens: int

    def state(self, text: str, id: int | None = None) -> SummaryState:
        """The summary this task yields once the summarizer wrote ``text``."""
        return SummaryState(self.end, self.start_unit, text, self.facts, id)


@dataclass(frozen=True)
class Budget:
    """The token budget a request must fit, computed by the caller.

    ``limit`` is the budget for the message list (None: no token limit);
    ``fixed`` is what the request costs besides its messages (tool
    definitions, reply priming) and counts against ``limit``.
    """

    limit: int | None = None
    fixed: int = 0
    # Tokens set aside for recalled turns (policies.recall), already taken off ``limit``.
    recall: int = 0
    # Recall's reserve when it was not taken off ``limit`` (the conversation fits
    # the whole budget, so the policy drops nothing for tokens): recall gets up to
    # this much of what the policy's decision leaves (:func:`policies.recall.recall_budget`).
    spare: int = 0


@dataclass(frozen=True)
class Clip:
    """A tool result shortened to fit: head and tail kept, a marker between."""

    index: int
    tokens_before: int
    tokens_after: int


@dataclass(frozen=True)
class Mask:
    """A tool result whose content was replaced by a placeholder (see policies.mask)."""

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
    # Tool results masked (policies.mask): forwarded as a placeholder, stored in full,
    # so recall may treat their content like an evicted turn's.
    masked: tuple[Mask, ...] = ()
    turns_dropped: int = 0
    # Which limit caused the drop: "max_turns", "max_tokens", "orphan", or None.
    reason: str | None = None
    tokens_before: int = 0
    tokens_after: int = 0
    budget: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(self.dropped or self.clipped or self.masked)

    def but(self, **changes: Any) -> Decision:
        """A copy with ``changes``: ``dataclasses.replace`` without its per-call walk of the
        fields and a frozen ``__init__`` (a memoized request makes several; ~3x faster).
        A name that is not a field raises TypeError, as ``replace`` does."""
        unknown = changes.keys() - _DECISION_FIELDS
        if unknown:
            raise TypeError(f"Decision has no field {sorted(unknown)[0]!r}")
        copy = object.__new__(Decision)
        values = copy.__dict__
        values.update(self.__dict__)
        values.update(changes)
        return copy


_DECISION_FIELDS = frozenset(Decision.__dataclass_fields__)


class ContextTooLong(Exception):
    """System messages plus the newest turn cannot fit the budget."""

    def __init__(self, needed: int, budget: int) -> None:
        super().__init__(
            f"This request needs {needed} tokens after trimming, but the context "
            f"budget is {budget} tokens."
        )
        self.needed = needed
        self.budget = budget
