"""A finished chat request as the request row, the ``request_completed`` line and metrics say it."""

from __future__ import annotations

import time
from typing import Any

from proxy.chat.recall_step import recall_log_fields
from proxy.chat.state import ExchangeState
from proxy.context.windows import listed_models
from proxy.errors import ProxyError
from proxy.store.base import RequestRecord
from proxy.telemetry.cache_usage import cache_usage
from proxy.telemetry.logging import log_line


class ExchangeRecord(ExchangeState):
    """The row, the line and the metrics of an exchange, from its state."""

    def _record(
        self,
        status: int,
        upstream_status: int | None,
        usage: dict[str, Any] | None,
        incomplete: bool,
        error: ProxyError | None,
        total_ms: float,
    ) -> RequestRecord:
        d = self.decision
        record = RequestRecord(
            id=self.id,
            tenant=self.tenant,
            route=self.route.name if self.route else "",
            policy=self.policy or (self.route.policy if self.route else ""),
            mode=self.mode,
            model=self.model,
            stream=self.stream,
            status=status,
            upstream_status=upstream_status,
            session_key=self.key,
            endpoint=self.endpoint,
            messages_before=len(self.conversation),
            error=f"{error.code or error.type}: {error.message}" if error else None,
            incomplete=incomplete,
            upstream_ms=self.upstream_ms,
            total_ms=total_ms,
            usage=usage,
            created_at=time.time(),
            stable_prefix=self.stable_prefix,
        )
        cached = cache_usage(usage)
        record.upstream_prompt_tokens = cached.prompt_tokens
        record.cached_tokens = cached.cached_tokens
        record.cache_write_tokens = cached.cache_write_tokens
        if d is not None:
            record.messages_after = len(d.messages)
            record.tokens_before = d.tokens_before
            record.tokens_after = d.tokens_after
            record.turns_dropped = d.turns_dropped
            record.messages_dropped = len(d.dropped)
            record.dropped_indexes = list(d.dropped)
            record.reason = d.reason
            record.detail = {
                "budget": d.budget,
                "repaired": list(d.repaired),
                "clipped": [
                    {
                        "index": c.index,
                        "tokens_before": c.tokens_before,
                        "tokens_after": c.tokens_after,
                    }
                    for c in d.clipped
                ],
                **d.extra,
            }
            if d.masked:
                # Positions in the conversation as received, as for ``clipped``.
                record.detail["masked"] = [
                    {
                        "index": m.index,
                        "tokens_before": m.tokens_before,
                        "tokens_after": m.tokens_after,
                    }
                    for m in d.masked
                ]
        if self.session_source is not None:
            record.detail["session_source"] = self.session_source
        if self.summary is not None:
            record.detail.update(self.summary.detail(record.detail.get("summary")))
        if self.recall is not None:
            record.detail["recall"] = self.recall.detail()
        if self.cache is not None and self.cache.sent:
            record.detail["cache_hints"] = self.cache.detail()
        if self.fence is not None:
            record.detail["fence"] = self.fence
        return record

    def _observe(self, r: RequestRecord) -> None:
        """Metrics and token calibration: a few dict updates, no I/O."""
        metrics = self.rt.metrics
        fallback = r.detail.get("fallback")
        metrics.observe_request(
            route=r.route,
            policy=r.policy,
            status=r.status,
            total_ms=r.total_ms,
            upstream_ms=r.upstream_ms,
            tokens_before=r.tokens_before,
            tokens_after=r.tokens_after,
            fallback=fallback if isinstance(fallback, str) else None,
        )
        if self.policy_s is not None:
            metrics.policy_seconds.observe((r.policy,), self.policy_s)
        metrics.observe_cache(
            route=r.route,
            policy=r.policy,
            prompt_tokens=r.upstream_prompt_tokens,
            cached_tokens=r.cached_tokens,
            cache_write_tokens=r.cache_write_tokens,
        )
        if r.upstream_status == 200 and r.usage is not None:
            # What was forwarded (messages plus tools and priming) vs what was billed.
            self.rt.calibration.observe_usage(
                r.model,
                r.tokens_after,
                r.usage,
                upstream=self.route.upstream if self.route is not None else None,
                answered_as=self.answered_as,
            )
            if self.route is not None and self.rt.calibration.ambiguous(self.route.upstream):
                self._ask_served_models(self.route.upstream)

    def _ask_served_models(self, upstream: str) -> None:
        """Once per upstream, in the background: the models it lists (calibration's key).

        Asked when an upstream has answered as two models: a server that echoes each
        name it is sent (llama-cpp-python) may still serve one."""
        asked = self.rt.models_asked
        if upstream in asked:
            return
        asked.add(upstream)
        config = self.rt.config.upstreams[upstream]
        if config.base_url is None:
            return

        async def ask() -> None:
            listed = await listed_models(config)
            if listed is not None:
                self.rt.calibration.serves(upstream, listed)

        self.rt.background.spawn(ask(), name=f"models-{upstream}")

    def _log(self, r: RequestRecord) -> None:
        # A 5xx is the proxy's or the upstream's failure: warning, so alerts can key on level.
        log_line(
            "warning" if r.status >= 500 else "info",
            "request_completed",
            {
                "request_id": r.id,
                "session": r.session_key,
                "session_source": self.session_source,
                "tenant": r.tenant,
                "route": r.route,
                "policy": r.policy,
                "mode": r.mode,
                "model": r.model,
                "stream": r.stream,
                "status": r.status,
                "upstream_status": r.upstream_status,
                "messages_before": r.messages_before,
                "messages_after": r.messages_after,
                "tokens_before": r.tokens_before,
                "tokens_after": r.tokens_after,
                "turns_dropped": r.turns_dropped,
                "messages_dropped": r.messages_dropped,
                "reason": r.reason,
                "summary_used": self.summary.status if self.summary else None,
                "fallback": r.detail.get("fallback"),
                **(recall_log_fields(self.recall) if self.recall is not None else {}),
                **compaction_log_fields(r.detail),
                "incomplete": r.incomplete,
                "stable_prefix": r.stable_prefix,
                "upstream_prompt_tokens": r.upstream_prompt_tokens,
                "cached_tokens": r.cached_tokens,
                "cache_write_tokens": r.cache_write_tokens,
                "error": r.error,
                "upstream_ms": round(r.upstream_ms, 2) if r.upstream_ms is not None else None,
                "total_ms": round(r.total_ms or 0.0, 2),
            },
        )


def compaction_log_fields(detail: dict[str, Any]) -> dict[str, Any]:
    """The log line's word on a compaction (docs/guides/compaction.md), when there was one."""
    compaction = detail.get("compaction")
    if not isinstance(compaction, dict):
        return {}
    status = compaction.get("status") or ("expanded" if compaction.get("expanded") else None)
    return {"compaction": status, "compaction_fallback": compaction.get("fallback")}
