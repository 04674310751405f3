"""Summaries on the request path: stored ones found, new ones made once, the next one ahead.

For a ``strategy: summarize`` route, :meth:`SummaryService.decide` reads the
stored summaries covering a prefix of the conversation, asks the pure
planner (:mod:`policies.summarize`) what to forward, and when a new summary
is needed makes it (bounded by the summarizer's timeout) or falls back to
trimming. After the answer is sent, :meth:`SummaryService.prefetch_after`
prepares the summary the next request will need, so requests rarely wait.

Single flight: a summary in progress is keyed by (session, first turn it
covers, path hash of the last item it covers). A request needing a range
already in progress (a prefetch, or a concurrent request) waits for that
call instead of making another. Across processes, the store is checked
before the call, and saving is first-writer-wins per range, so a late
duplicate is never stored. With shared ``flights`` (proxy/coordination/,
Redis), the range is also claimed across instances before the call: an
instance that finds it claimed waits for the summary to reach the store
(proxy/context/summary_flight.py) instead of calling the summarizer too.

A summary is stored only after the summarizer answered; a failure leaves
the store as it was, and the request is served by the trimming fallback.

A request planned as the session's last one was takes that plan, and a
prefetch that found nothing to make is not planned again
(proxy/context/plan_memo.py); path hashes are kept per session
(proxy/context/chain_paths.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.facts import unsupported
from policies.summarize import assemble, plan, prefetch
from policies.transcript import message_text
from policies.types import (
    Budget,
    ContextTooLong,
    CountFn,
    Decision,
    Message,
    SummarizerSpec,
    SummarizeSpec,
    SummaryState,
    SummaryTask,
)
from proxy.background import Background
from proxy.config.model import UpstreamConfig
from proxy.context.chain_paths import ChainPaths
from proxy.context.circuit import Breaker
from proxy.context.plan_memo import PlanMemo, PlannedView, StoredStates, plan_key, summary_state
from proxy.context.summarizer import (
    EXTRACTIVE_MODEL,
    AnthropicSummarizer,
    ExtractiveSummarizer,
    LLMSummarizer,
    Summarizer,
    SummaryFailed,
)
from proxy.context.summary_chunks import summarize_range
from proxy.context.summary_flight import Claim, claim_range
from proxy.coordination.base import Flights
from proxy.store.base import (
    MessageIn,
    SessionRef,
    Store,
    StoredSummary,
    SummaryIn,
    chain_path_hashes,
    path_hash,
)
from proxy.telemetry.logging import get_logger
from proxy.telemetry.metrics import Metrics
from proxy.upstream.base import Upstream

log = get_logger()


@dataclass(frozen=True)
class SummaryContext:
    """One request's view, as the service needs it."""

    ref: SessionRef | None
    spec: SummarizeSpec
    messages: Sequence[Message]
    # Content hashes of ``messages`` (None without a session).
    hashes: Sequence[str] | None
    count: CountFn
    budget: Budget
    # Builds the summarizer, only when one is needed.
    summarizer: Callable[[], Summarizer]
    # The route's name: the summarizer's circuit breaker is per route.
    route: str = ""
    # The model ``count`` counts for ("": unknown, so no plan is memoized).
    model: str = ""

    # The session's last path hashes (None: each request hashes its whole history).
    chains: ChainPaths | None = None
    # Token counts of ``messages`` by position, when known (the plan counts no message again).
    sizes: Sequence[int] | None = None
    # The chat message each of ``messages`` reads as, for the summarizer's transcript
    # (Responses items); None: they are chat messages.
    view: Callable[[Message], Message] | None = None

    @functools.cached_property
    def paths(self) -> list[str] | None:
        """Path hashes of ``messages`` (None without a session): computed once per request,
        for the decision and the prefetch after the answer alike."""
        if self.ref is None or self.hashes is None:
            return None
        if self.chains is not None:
            return self.chains.of(self.ref, self.hashes)
        return chain_path_hashes(self.hashes)


@dataclass(frozen=True)
class SummaryOutcome:
    decision: Decision
    # none | reused | created | waited | fallback | needed (a preview: nothing is made)
    status: str
    # Why the trimming fallback served the request (summarizer_timeout, ...).
    fallback: str | None = None
    # How long the request waited for a summarizer.
    wait_ms: float | None = None
    summary_id: int | None = None

    def detail(self, view: object = None) -> dict[str, Any]:
        """What the request row says: ``summary`` (``view``, the decision's account of
        the summary it forwarded, plus status, id and wait) and ``fallback``."""
        summary: dict[str, Any] = dict(view) if isinstance(view, Mapping) else {}
        summary["status"] = self.status
        if self.summary_id is not None:
            summary["id"] = self.summary_id
        if self.wait_ms is not None:
            summary["wait_ms"] = round(self.wait_ms, 2)
        out: dict[str, Any] = {"summary": summary}
        if self.fallback is not None:
            out["fallback"] = self.fallback
        return out


_Key = tuple[SessionRef, int, str]
_Result = StoredSummary | SummaryFailed


@dataclass(frozen=True)
class Made:
    """A summary a request asked for: stored (or why not), whether it joined a call
    in progress, and how long it waited (None: no call was waited for)."""

    result: _Result
    joined: bool
    wait_ms: float | None


class SummaryService:
    def __init__(
        self,
        store: Store,
        background: Background,
        metrics: Metrics,
        *,
        flights: Flights | None = None,
        breaker: Breaker | None = None,
    ) -> None:
        self.store = store
        self.background = background
        self.metrics = metrics
        self.flights = flights
        self._inflight: dict[_Key, asyncio.Task[_Result]] = {}
        # Repeated failures of a route's summarizer stop its calls for a while.
        self.breaker = breaker or Breaker()
        self.breaker.register(metrics)
        # Each session's last plan, for a request planned as the last one was.
        self.memo = PlanMemo()
        # Each session's last path hashes, for the prefix its next request resends.
        self.chains = ChainPaths()
        # Stored summaries as plans take them.
        self._stored = StoredStates()

    @property
    def inflight(self) -> int:
        return len(self._inflight)

    async def decide(self, ctx: SummaryContext, *, dry_run: bool = False) -> SummaryOutcome:
        """The decision for one request; waits for a needed summary (bounded), or falls back.

        ``dry_run`` (previews): nothing is made or stored; a needed summary
        shows as the fallback with status ``needed``.
        """
        paths = ctx.paths
        states = await self.states(ctx.ref, paths) if ctx.ref and paths else []
        memo_key = self._key(ctx, paths, len(ctx.messages), states)
        known = (
            self.memo.view(ctx.ref, memo_key)
            if ctx.ref is not None and memo_key is not None
            else None
        )
        if known is not None:
            if known.status == "reused":
                self.metrics.count_summary("reused")
            decision = known.decision_for(ctx.messages)
            return SummaryOutcome(decision, known.status, summary_id=known.summary_id)
        planned = plan(ctx.messages, ctx.spec, ctx.count, ctx.budget, states, ctx.sizes)
        if planned.decision is not None:
            if planned.reused is None:
                outcome = SummaryOutcome(planned.decision, "none")
            else:
                self.metrics.count_summary("reused")
                outcome = SummaryOutcome(planned.decision, "reused", summary_id=planned.reused.id)
            if ctx.ref is not None and memo_key is not None:
                view = PlannedView.of(
                    planned.decision, ctx.messages, outcome.status, outcome.summary_id
                )
                if view is not None:
                    self.memo.remember_view(ctx.ref, memo_key, view)
            return outcome
        task, backup = planned.task, planned.fallback
        assert task is not None and backup is not None  # a plan without a decision has both
        if ctx.ref is None or paths is None:
            return SummaryOutcome(backup, "fallback", fallback="no_session")
        if dry_run:
            marked = dataclasses.replace(backup, extra={**backup.extra, "summary_needed": True})
            return SummaryOutcome(marked, "needed")
        made = await self.made(ctx, task, paths)
        result, wait_ms = made.result, made.wait_ms
        if isinstance(result, SummaryFailed):
            reason = f"summarizer_{result.reason}"
            return SummaryOutcome(backup, "fallback", fallback=reason, wait_ms=wait_ms)
        state = summary_state(result, task.end)
        try:
            decision = assemble(ctx.messages, ctx.spec, ctx.count, ctx.budget, state, ctx.sizes)
        except ContextTooLong:
            # The summary itself does not fit the budget: trimming alone does.
            return SummaryOutcome(backup, "fallback", fallback="summary_too_long", wait_ms=wait_ms)
        status = "waited" if made.joined else "created"
        return SummaryOutcome(decision, status, wait_ms=wait_ms, summary_id=result.id)

    async def made(self, ctx: SummaryContext, task: SummaryTask, paths: Sequence[str]) -> Made:
        """The summary ``task`` asks for, made once per range (a call in progress is
        joined), waited for within the summarizer's timeout; a failure is returned,
        an open circuit as ``unavailable`` with no call. ``ctx`` has a session."""
        assert ctx.ref is not None
        key = (ctx.ref, task.start_unit, paths[task.end - 1])
        running = self._inflight.get(key)
        joined = running is not None
        if running is None:
            if not self.breaker.allow(ctx.route):
                # The circuit is open: no call, straight to the fallback.
                return Made(SummaryFailed("unavailable", "the circuit is open"), False, None)
            running = self._start(key, ctx, task, paths)
        started = time.perf_counter()
        try:
            result = await asyncio.wait_for(asyncio.shield(running), ctx.spec.summarizer.timeout_s)
        except TimeoutError:
            result = SummaryFailed("timeout", "the request stopped waiting")
        return Made(result, joined, (time.perf_counter() - started) * 1000)

    def prefetch_after(self, ctx: SummaryContext, reply: Message, reply_hash: str) -> None:
        """After the answer: prepare the next summary in the background if it will be needed."""
        if ctx.ref is None or ctx.hashes is None or not ctx.spec.prefetch:
            return
        known = ctx.paths or []
        paths = [*known, path_hash(known[-1] if known else None, reply_hash)]
        # Usually planned before with nothing to make: told without a task or a read when
        # the store knows the session's summaries (SQLite's memo).
        stored = self.store.summaries_known(ctx.ref, paths)
        if stored is not None and self._idle(ctx, paths, self._stored.states(stored, paths)):
            return
        self.background.spawn(
            self._prefetch(ctx, reply, reply_hash, paths), name="summary-prefetch"
        )

    def _idle(self, ctx: SummaryContext, paths: Sequence[str], states: list[SummaryState]) -> bool:
        """A prefetch of ``paths`` was planned before with these summaries: nothing to make."""
        assert ctx.ref is not None
        memo_key = self._key(ctx, paths, len(ctx.messages) + 1, states)
        return memo_key is not None and self.memo.idle(ctx.ref, memo_key)

    async def _prefetch(
        self, ctx: SummaryContext, reply: Message, reply_hash: str, paths: list[str]
    ) -> None:
        assert ctx.ref is not None and ctx.hashes is not None
        messages = [*ctx.messages, reply]
        hashes = [*ctx.hashes, reply_hash]
        states = await self.states(ctx.ref, paths)
        memo_key = self._key(ctx, paths, len(messages), states)
        if memo_key is not None and self.memo.idle(ctx.ref, memo_key):
            return  # planned before: nothing to make
        sizes = None if ctx.sizes is None else [*ctx.sizes, ctx.count(reply)]
        task = prefetch(messages, ctx.spec, ctx.count, ctx.budget, states, sizes)
        if task is None:
            if memo_key is not None:
                self.memo.remember_idle(ctx.ref, memo_key)
            return
        key = (ctx.ref, task.start_unit, paths[task.end - 1])
        if key not in self._inflight and self.breaker.allow(ctx.route):
            ahead = dataclasses.replace(ctx, messages=messages, hashes=hashes, sizes=sizes)
            await self._start(key, ahead, task, paths, prefetched=True)

    @staticmethod
    def _key(
        ctx: SummaryContext, paths: Sequence[str] | None, n: int, states: Sequence[SummaryState]
    ) -> Hashable | None:
        """The memo's key for a plan of the first ``n`` messages (None: not memoized)."""
        if not paths or not ctx.model or len(paths) != n:
            return None
        return plan_key(paths[-1], n, ctx.spec, ctx.budget, ctx.model, states)

    async def states(self, ref: SessionRef, paths: Sequence[str]) -> list[SummaryState]:
        return self._stored.states(await self.store.summaries_for(ref, paths), paths)

    def _start(
        self,
        key: _Key,
        ctx: SummaryContext,
        task: SummaryTask,
        paths: Sequence[str],
        *,
        prefetched: bool = False,
    ) -> asyncio.Task[_Result]:
        job = self.background.spawn(self._make(ctx, task, paths, prefetched), name="summary")
        self._inflight[key] = job

        def forget(done: asyncio.Task[_Result]) -> None:
            if self._inflight.get(key) is done:
                del self._inflight[key]

        job.add_done_callback(forget)
        return job

    async def _make(
        self, ctx: SummaryContext, task: SummaryTask, paths: Sequence[str], prefetched: bool
    ) -> _Result:
        """Make, check and store one summary; a failure is returned, never raised."""
        assert ctx.ref is not None and ctx.hashes is not None
        started = time.perf_counter()
        fields: dict[str, Any] = {
            "session": ctx.ref.key,
            "tenant": ctx.ref.tenant,
            "units": task.cut_unit - task.start_unit,
            "new_messages": len(task.source),
            "incremental": task.previous is not None,
            "prefetch": prefetched,
        }
        try:
            # Another process may have made it since this request read the store.
            end = paths[task.end - 1]
            for found in await self.store.summaries_for(ctx.ref, paths[: task.end]):
                if (found.covers_path_hash, found.start_unit) == (end, task.start_unit):
                    return found
            claim: Claim | None = None
            if self.flights is not None:
                claimed = await claim_range(
                    self.flights, self.store, ctx.ref, task, paths, ctx.spec.summarizer.timeout_s
                )
                if isinstance(claimed, SummaryFailed):
                    return self._failed(claimed, fields, started, ctx.route)
                if not isinstance(claimed, Claim):
                    return claimed  # another instance made it
                claim = claimed
            try:
                stored, output, flagged = await self._summarize(ctx, task, fields)
            finally:
                if claim is not None:
                    await claim.done()
        except SummaryFailed as exc:
            return self._failed(exc, fields, started, ctx.route)
        except Exception as exc:  # the boundary: a summary is optional, the request is not
            log.error("summary_error", error=repr(exc), exc_info=exc, **fields)
            return self._failed(SummaryFailed("error", repr(exc)), fields, started, ctx.route)
        ms = round((time.perf_counter() - started) * 1000, 2)
        self.metrics.count_summary("made")
        log.info("summary_made", summary_id=stored.id, ms=ms, usage=output.usage, **fields)
        if flagged:
            # The entities themselves are message content: debug level only.
            log.warning("summary_unverified_entities", summary_id=stored.id, count=len(flagged))
            log.debug("summary_unverified_entities_values", summary_id=stored.id, values=flagged)
        return stored

    async def _summarize(
        self, ctx: SummaryContext, task: SummaryTask, fields: dict[str, Any]
    ) -> tuple[StoredSummary, Any, list[str]]:
        """Call the summarizer and store what it made (raises SummaryFailed)."""
        assert ctx.ref is not None and ctx.hashes is not None
        summarizer = ctx.summarizer()
        fields["counted"] = summarizer.model != EXTRACTIVE_MODEL  # offline: never "down"
        previous = task.previous
        shown = viewed(ctx.messages, task.source, ctx.view)
        output = await summarize_range(
            summarizer,
            ctx.spec.summarizer,
            previous.text if previous is not None else None,
            shown,
            task.source,
            task.max_tokens,
            ctx.count,
        )
        if fields.pop("counted"):
            self.breaker.success(ctx.route)  # it answered (what follows is ours)
        source = [message_text(shown[i]) for i in task.source]
        if previous is not None:
            source += [previous.text, *(f.value for f in previous.facts)]
        flagged = unsupported(output.text, "\n".join(source))
        covered = [
            # An item's role is a message's role, else its type (as the Responses door stores it).
            MessageIn(dict(m), h, str(m.get("role") or m.get("type")), token_count=ctx.count(m))
            for m, h in zip(ctx.messages[: task.end], ctx.hashes[: task.end], strict=True)
        ]
        stored = await self.store.save_summary(
            ctx.ref,
            covered,
            SummaryIn(
                text=output.text,
                start_unit=task.start_unit,
                facts=tuple(f.as_json() for f in task.facts),
                flagged=tuple(flagged),
                model=output.model,
                prompt_hash=summarizer.prompt_hash,
                usage=output.usage,
                previous_summary_id=previous.id if previous is not None else None,
            ),
        )
        return stored, output, flagged

    def _failed(
        self, exc: SummaryFailed, fields: dict[str, Any], started: float, route: str
    ) -> SummaryFailed:
        if fields.pop("counted", False):
            self.breaker.failure(route)
        self.metrics.count_summary("failed")
        ms = round((time.perf_counter() - started) * 1000, 2)
        log.warning("summary_failed", reason=exc.reason, detail=exc.detail, ms=ms, **fields)
        return exc


def viewed(
    messages: Sequence[Message],
    indexes: Sequence[int],
    view: Callable[[Message], Message] | None,
) -> Sequence[Message]:
    """``messages`` with those at ``indexes`` as ``view`` shows them (no view: as they are)."""
    if view is None:
        return messages
    shown = list(messages)
    for i in indexes:
        shown[i] = view(messages[i])
    return shown


def build_summarizer(
    spec: SummarizerSpec,
    *,
    model: str,
    upstream: str,
    upstream_configs: Mapping[str, UpstreamConfig],
    upstreams: Mapping[str, Upstream],
    client_headers: Mapping[str, str],
    count: CountFn,
) -> Summarizer:
    """The summarizer a policy names: its model (default: the request's) on its upstream.

    The upstream's configured key is used; without one, the client's own
    Authorization header, as for the request itself.
    """
    name = spec.model or model
    if name == EXTRACTIVE_MODEL:
        empty = count({"content": ""})
        return ExtractiveSummarizer(lambda text: count({"content": text}) - empty)
    which = spec.upstream or upstream
    config = upstream_configs[which]
    headers = {k.lower(): v for k, v in config.headers.items()}
    if config.api_key is not None and config.anthropic:
        headers["x-api-key"] = config.api_key
    elif config.api_key is not None:
        headers["authorization"] = f"Bearer {config.api_key}"
    else:
        # The client's own key (Anthropic's clients may send it as x-api-key).
        headers.update(
            (k, v) for k, v in client_headers.items() if k in ("authorization", "x-api-key")
        )
    if config.anthropic and "anthropic-version" in client_headers:
        headers["anthropic-version"] = client_headers["anthropic-version"]
    kind = AnthropicSummarizer if config.anthropic else LLMSummarizer
    return kind(
        upstreams[which],
        model=name,
        prompt=spec.prompt,
        timeout_s=spec.timeout_s,
        headers=headers,
        # A template that shows no system message would never show the instructions.
        system=config.system_messages != "none",
    )
