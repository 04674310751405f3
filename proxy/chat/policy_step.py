"""The chat pipeline's policy step for modes and summaries (``ChatExchange.plan`` calls these).

Which policy serves a request: the route's, or a context mode the request
picked (``X-Context-Mode``, when the route allows it) or a route rule chose
from the latest user message. A summarize policy then runs through the
summary service (stored summaries, a bounded wait for a new one, or the
trimming fallback); any other policy through the rewriter, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from policies.modes import MODES, ModeChoice, select
from policies.recall import recall_budget
from policies.types import ContextTooLong, Decision, Message, SummarizeSpec
from proxy.config.model import RouteConfig
from proxy.context.rewriter import conversation_tokens
from proxy.context.summaries import SummaryContext, SummaryOutcome, build_summarizer
from proxy.errors import ContextLengthExceeded, InvalidRequest
from proxy.runtime import Runtime
from proxy.store.base import SessionRef

MODE_HEADER = "x-context-mode"


def mode_rule(route: RouteConfig, choice: ModeChoice) -> str | None:
    """``X-Context-Mode-Rule`` on a route with modes: what chose the mode.

    The name of the rule that fired, ``header`` when the request's
    ``X-Context-Mode`` chose, ``none`` when neither did (the route's policy
    serves): a newcomer can see why a request was, or was not, switched.
    """
    if route.modes is None:
        return None
    if choice.rule is not None:
        return choice.rule
    return "header" if choice.by == "header" else "none"


def choose_mode(
    route: RouteConfig, conversation: Sequence[Message], headers: Mapping[str, str]
) -> ModeChoice:
    """The policy (and mode) for this request; a bad ``X-Context-Mode`` is a 400."""
    modes = route.modes
    requested: str | None = None
    if modes is not None and modes.header:
        value = (headers.get(MODE_HEADER) or "").strip().lower()
        if value:
            if value not in MODES:
                raise InvalidRequest(
                    f"X-Context-Mode must be one of {', '.join(MODES)}; got {value!r}.",
                    param="X-Context-Mode",
                    code="invalid_value",
                )
            requested = value
    rules = modes.rules if modes is not None else ()
    return select(route.policy, conversation, requested=requested, rules=rules)


async def summarize(
    rt: Runtime,
    spec: SummarizeSpec,
    *,
    route: RouteConfig,
    ref: SessionRef | None,
    conversation: Sequence[Message],
    hashes: Sequence[str] | None,
    body: Mapping[str, Any],
    model: str,
    headers: Mapping[str, str],
    dry_run: bool,
    counts: Sequence[int] | None = None,
) -> tuple[Decision, SummaryOutcome, SummaryContext]:
    """A summary policy's decision for one request, with what became of the summary.

    ``counts``: the conversation's token counts (a session's message cache has them).
    """
    if spec.placement == "system" and rt.config.upstreams[route.upstream].system_messages != "all":
        # Its template would not show the model a summary in a later system message:
        # a user/assistant pair reaches it on any template.
        spec = dataclasses.replace(spec, placement="pair")
    count = rt.rewriter.counter(conversation, model, hashes, counts=counts)
    tokens = conversation_tokens(spec, conversation, count, counts)
    budget, factor = rt.rewriter.budget(spec, body, model, tokens=tokens, upstream=route.upstream)
    # The client's key and API version, for a summarizer on its upstream.
    auth = {
        k: headers[k] for k in ("authorization", "x-api-key", "anthropic-version") if k in headers
    }
    upstream_configs, upstreams = rt.config.upstreams, rt.upstreams

    def summarizer() -> Any:
        return build_summarizer(
            spec.summarizer,
            model=model,
            upstream=route.upstream,
            upstream_configs=upstream_configs,
            upstreams=upstreams,
            client_headers=auth,
            count=count,
        )

    ctx = SummaryContext(
        ref,
        spec,
        conversation,
        hashes,
        count,
        budget,
        summarizer,
        route=route.name,
        model=model,
        chains=rt.summaries.chains,
        sizes=counts,
    )
    try:
        outcome = await rt.summaries.decide(ctx, dry_run=dry_run)
    except ContextTooLong as exc:
        raise ContextLengthExceeded(
            f"{exc} Shorten the newest turn or raise the policy's budget.", param="messages"
        ) from exc
    decision = outcome.decision
    if factor != 1.0:
        decision = decision.but(extra={**decision.extra, "calibration": factor})
    room = recall_budget(budget, decision)
    if room:
        decision = decision.but(extra={**decision.extra, "recall_budget": room})
    return decision, outcome, ctx
