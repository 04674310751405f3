"""A small Prometheus registry: counters, gauges, histograms and the text exposition.

Written here rather than imported because the hot path only needs dict and
list increments: no locks (everything runs on one event loop), no label
objects. Label values are tuples in the order of ``labelnames``; every label
used here has a bounded set of values (routes, policies, status codes,
models the upstream accepted), never a session id.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from starlette.requests import Request
from starlette.responses import Response

Labels = tuple[str, ...]

# Seconds. Total and upstream latency span milliseconds to minutes (streams).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# Policy and store work: tens of microseconds to tens of milliseconds.
FAST_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0)

SummaryOutcome = Literal["made", "reused", "failed"]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Labels, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _number(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Metric:
    kind = "untyped"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)

    def samples(self) -> Iterable[str]:
        raise NotImplementedError

    def render(self) -> str:
        head = f"# HELP {self.name} {self.help}\n# TYPE {self.name} {self.kind}\n"
        return head + "".join(line + "\n" for line in self.samples())


class Counter(Metric):
    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()) -> None:
        super().__init__(name, help_text, labelnames)
        self.values: dict[Labels, float] = {}
        if not self.labelnames:
            self.values[()] = 0.0

    def inc(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def value(self, labels: Labels = ()) -> float:
        return self.values.get(labels, 0.0)

    def samples(self) -> Iterable[str]:
        for labels, value in self.values.items():
            yield f"{self.name}{_labels(self.labelnames, labels)} {_number(value)}"


class Gauge(Counter):
    kind = "gauge"

    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value

    def dec(self, labels: Labels = (), amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) - amount


class CallbackGauge(Metric):
    """A gauge read when scraped (calibration factors live in their own object)."""

    kind = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str],
        read: Callable[[], Iterable[tuple[Labels, float]]],
    ) -> None:
        super().__init__(name, help_text, labelnames)
        self.read = read

    def samples(self) -> Iterable[str]:
        for labels, value in self.read():
            yield f"{self.name}{_labels(self.labelnames, labels)} {_number(value)}"


class Histogram(Metric):
    kind = "histogram"

    def __init__(
        self,
        name: str,
        help_text: str,
        labelnames: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> None:
        super().__init__(name, help_text, labelnames)
        self.bounds = tuple(sorted(buckets))
        # Per label set: per-bucket counts (not cumulative; the last is +Inf), sum.
        self.counts: dict[Labels, list[int]] = {}
        self.sums: dict[Labels, float] = {}

    def observe(self, labels: Labels, value: float) -> None:
        counts = self.counts.get(labels)
        if counts is None:
            counts = self.counts[labels] = [0] * (len(self.bounds) + 1)
            self.sums[labels] = 0.0
        counts[bisect_left(self.bounds, value)] += 1
        self.sums[labels] += value

    def count(self, labels: Labels = ()) -> int:
        return sum(self.counts.get(labels, ()))

    def samples(self) -> Iterable[str]:
        for labels, counts in self.counts.items():
            running = 0
            for bound, n in zip((*self.bounds, float("inf")), counts, strict=True):
                running += n
                le = f'le="{_number(bound)}"'
                yield f"{self.name}_bucket{_labels(self.labelnames, labels, le)} {running}"
            yield f"{self.name}_sum{_labels(self.labelnames, labels)} {_number(self.sums[labels])}"
            yield f"{self.name}_count{_labels(self.labelnames, labels)} {running}"


class Registry:
    def __init__(self) -> None:
        self.metrics: dict[str, Metric] = {}

    def add(self, metric: Metric) -> None:
        if metric.name in self.metrics:
            raise ValueError(f"metric already registered: {metric.name}")
        self.metrics[metric.name] = metric

    def render(self) -> str:
        return "".join(m.render() for m in self.metrics.values())


class Metrics:
    """ctxproxy's metrics, by name. Everything a request adds goes through ``observe_request``."""

    def __init__(self) -> None:
        self.registry = r = Registry()
        self.requests = Counter(
            "ctxproxy_requests_total",
            "Requests handled, by route, policy and HTTP status.",
            ("route", "policy", "status"),
        )
        self.request_seconds = Histogram(
            "ctxproxy_request_duration_seconds",
            "Whole request, body read to last byte relayed, by route.",
            ("route",),
        )
        self.upstream_seconds = Histogram(
            "ctxproxy_upstream_duration_seconds",
            "From sending upstream to the upstream's response headers, by route.",
            ("route",),
        )
        self.policy_seconds = Histogram(
            "ctxproxy_policy_duration_seconds",
            "Time the route's policy took to decide, by policy.",
            ("policy",),
            FAST_BUCKETS,
        )
        self.store_seconds = Histogram(
            "ctxproxy_store_duration_seconds",
            "Store operations: history reads on the request path and exchange writes.",
            ("operation",),
            FAST_BUCKETS,
        )
        self.tokens_before = Counter(
            "ctxproxy_tokens_before_total",
            "Prompt tokens of the conversations as clients sent them (local count).",
            ("route", "policy"),
        )
        self.tokens_after = Counter(
            "ctxproxy_tokens_after_total",
            "Prompt tokens forwarded upstream after the policy (local count).",
            ("route", "policy"),
        )
        self.tokens_saved = Counter(
            "ctxproxy_tokens_saved_total",
            "Prompt tokens the policies left out (before minus after).",
            ("route", "policy"),
        )
        self.summaries = Counter(
            "ctxproxy_summaries_total",
            "Summaries made, reused from the store, or failed.",
            ("outcome",),
        )
        for outcome in ("made", "reused", "failed"):
            self.summaries.inc((outcome,), 0)
        self.fallbacks = Counter(
            "ctxproxy_fallbacks_total",
            "Requests where a policy fell back to a simpler decision, by policy and reason.",
            ("policy", "reason"),
        )
        self.active_streams = Gauge(
            "ctxproxy_active_streams", "Streamed answers being relayed right now."
        )
        self.sessions_expired = Counter(
            "ctxproxy_sessions_expired_total", "Idle sessions deleted by session.ttl."
        )
        self.reloads = Counter(
            "ctxproxy_config_reloads_total", "Config reloads (SIGHUP), by result.", ("result",)
        )
        for result in ("ok", "rejected"):
            self.reloads.inc((result,), 0)
        self.upstream_prompt_tokens = Counter(
            "ctxproxy_upstream_prompt_tokens_total",
            "Prompt tokens the upstream reported (its usage), where it reported them.",
            ("route", "policy"),
        )
        self.upstream_cached_tokens = Counter(
            "ctxproxy_upstream_cached_tokens_total",
            "Prompt tokens the upstream reported served from its prompt cache.",
            ("route", "policy"),
        )
        self.upstream_cache_write_tokens = Counter(
            "ctxproxy_upstream_cache_write_tokens_total",
            "Prompt tokens the upstream reported written to its prompt cache (Anthropic).",
            ("route", "policy"),
        )
        for metric in (
            self.requests,
            self.request_seconds,
            self.upstream_seconds,
            self.policy_seconds,
            self.store_seconds,
            self.tokens_before,
            self.tokens_after,
            self.tokens_saved,
            self.summaries,
            self.fallbacks,
            self.active_streams,
            self.sessions_expired,
            self.reloads,
            self.upstream_prompt_tokens,
            self.upstream_cached_tokens,
            self.upstream_cache_write_tokens,
        ):
            r.add(metric)
        # Recall (proxy/context/recall.py): evicted turns brought back.
        self.recall = Counter(
            "ctxproxy_recall_total",
            "Requests of policies with recall, by policy and outcome"
            " (recalled, none, error, no_session, unsupported).",
            ("policy", "outcome"),
        )
        self.recalled_turns = Counter(
            "ctxproxy_recalled_turns_total", "Turns recall brought back, by policy.", ("policy",)
        )
        self.recall_tokens = Counter(
            "ctxproxy_recall_tokens_total",
            "Tokens of the recall blocks forwarded, by policy.",
            ("policy",),
        )
        self.recall_seconds = Histogram(
            "ctxproxy_recall_duration_seconds",
            "Time recall added on the request path (index query and choice), by policy.",
            ("policy",),
            FAST_BUCKETS,
        )
        for metric in (self.recall, self.recalled_turns, self.recall_tokens, self.recall_seconds):
            r.add(metric)
        # Semantic recall (proxy/context/embeddings.py): stored messages embedded.
        self.embeddings = Counter(
            "ctxproxy_embeddings_total",
            "Stored messages given to the embedder, by outcome (stored, failed, dropped).",
            ("outcome",),
        )
        self.embedding_seconds = Histogram(
            "ctxproxy_embedding_batch_seconds",
            "Time to embed and store one batch of messages (in the background).",
            (),
            FAST_BUCKETS,
        )
        r.add(self.embeddings)
        r.add(self.embedding_seconds)
        # Streams that did not end as a whole answer (chat and Responses relays).
        self.unfinished_streams = Counter(
            "ctxproxy_unfinished_streams_total",
            "Streamed answers that did not end whole (no end marker, malformed events, cut"
            " off), by route and the error code the client was sent in-stream.",
            ("route", "code"),
        )
        r.add(self.unfinished_streams)

    def observe_request(
        self,
        *,
        route: str,
        policy: str,
        status: int,
        total_ms: float | None,
        upstream_ms: float | None,
        tokens_before: int,
        tokens_after: int,
        fallback: str | None = None,
    ) -> None:
        route = route or "none"
        policy = policy or "none"
        self.requests.inc((route, policy, str(status)))
        if total_ms is not None:
            self.request_seconds.observe((route,), total_ms / 1000)
        if upstream_ms is not None:
            self.upstream_seconds.observe((route,), upstream_ms / 1000)
        if tokens_before or tokens_after:
            key = (route, policy)
            self.tokens_before.inc(key, tokens_before)
            self.tokens_after.inc(key, tokens_after)
            self.tokens_saved.inc(key, max(0, tokens_before - tokens_after))
        if fallback:
            self.fallbacks.inc((policy, fallback))

    def observe_cache(
        self,
        *,
        route: str,
        policy: str,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        cache_write_tokens: int | None,
    ) -> None:
        """The upstream's own prompt-cache figures for one answer (see telemetry.cache_usage)."""
        if prompt_tokens is None and cached_tokens is None:
            return
        key = (route or "none", policy or "none")
        self.upstream_prompt_tokens.inc(key, prompt_tokens or 0)
        self.upstream_cached_tokens.inc(key, cached_tokens or 0)
        if cache_write_tokens is not None:
            self.upstream_cache_write_tokens.inc(key, cache_write_tokens)

    def count_summary(self, outcome: SummaryOutcome) -> None:
        """For the summarizer: one summary made, reused or failed."""
        self.summaries.inc((outcome,))

    def render(self) -> str:
        return self.registry.render()


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def metrics_endpoint(request: Request) -> Response:
    """GET /metrics: the Prometheus text exposition (no auth, as scrapers expect)."""
    runtime: Any = request.app.state.runtime
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)
