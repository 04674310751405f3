"""One chat request's state, and the response headers that say what was done with it.

:class:`ExchangeState` holds what the pipeline learns as it goes (route,
session, decision, summary, recall...); the request row and the log line
(:mod:`proxy.chat.record`) and the ``X-Context-*`` headers are read off it.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from starlette.requests import Request

from policies.types import Decision
from proxy.chat.cache_step import CacheHints
from proxy.chat.recall_step import recall_headers
from proxy.config.model import RouteConfig
from proxy.context.recall import RecallOutcome
from proxy.context.summaries import SummaryContext, SummaryOutcome
from proxy.errors import Door
from proxy.http.client_keys import request_tenant
from proxy.http.sessions import ANONYMOUS_TENANT, header_value
from proxy.runtime import Runtime
from proxy.store.base import SessionRef, Storable

# Request ids: a random per-process prefix and a counter; unique without a
# syscall per request (uuid4 reads the OS's random source every time).
_ID_PREFIX = os.urandom(6).hex()
_ID_COUNTER = itertools.count(1)


class ExchangeState:
    """One request's journey; its fields are what the log line and the request row say."""

    endpoint = "/v1/chat/completions"
    # The dialect its errors are answered in (proxy/errors.py).
    door: Door = "openai"

    def __init__(self, rt: Runtime, request: Request) -> None:
        self.rt = rt
        self.request = request
        self.id = f"{_ID_PREFIX}{next(_ID_COUNTER):010x}"
        self.started = time.perf_counter()
        # Decoded once: Starlette's Headers decodes and scans the raw list on every get.
        self.header_items = request.headers.items()
        # Lower-case names; the first of repeated headers wins, as with Headers.get.
        self.headers: dict[str, str] = dict(reversed(self.header_items))
        tenant = request_tenant(request.scope, self.headers, rt.config.session.anonymous_tenant)
        # No key and no anonymous tenant: proxied, nothing of it stored.
        self.may_store = tenant is not None
        self.tenant = tenant if tenant is not None else ANONYMOUS_TENANT
        self.route: RouteConfig | None = None
        self.ref: SessionRef | None = None
        self.key: str | None = None
        # Where the session id was found (proxy/http/session_lookup.py).
        self.session_source: str | None = None
        self.model: str | None = None
        self.stream = False
        self.conversation: list[dict[str, Any]] = []
        self.decision: Decision | None = None
        self.locked = False
        # The session lock's fencing token (shared stores check it; proxy/coordination/).
        self.fence: int | None = None
        self.upstream_ms: float | None = None
        # The model the upstream's answer names (calibration is kept per answering model).
        self.answered_as: str | None = None
        self.policy_s: float | None = None
        self.raw = b""
        self.hashes: list[str] | None = None
        # The conversation as the store takes it (sessions only): hashes and token counts.
        self.stored: Sequence[Storable] | None = None
        # The policy applied (a context mode may replace the route's), the mode,
        # and what became of the summary (summarize policies only).
        self.policy: str | None = None
        self.mode: str | None = None
        self.mode_rule: str | None = None
        self.summary: SummaryOutcome | None = None
        self.summary_ctx: SummaryContext | None = None
        # What recall did (policies with a ``recall:`` block only).
        self.recall: RecallOutcome | None = None
        # Leading forwarded messages the session's previous request forwarded too.
        self.stable_prefix: int | None = None
        # The prompt-cache hints sent upstream (prompt_cache_key, breakpoints).
        self.cache: CacheHints | None = None
        # What is left to do once the answer is sent (see ``sent``).
        self.after: Callable[[], object] | None = None

    def _headers(self) -> dict[str, str]:
        h = {"x-ctxproxy-request-id": self.id}
        if not self.may_store:
            h["x-context-store"] = "off-no-api-key"
        elif self.tenant == self.rt.config.session.anonymous_tenant:
            h["x-context-store"] = "anonymous-tenant"
        if self.key is not None:
            h["x-session-id"] = header_value(self.key)
            if self.session_source is not None:
                h["x-context-session-source"] = self.session_source
        if self.route is not None:
            h["x-context-policy"] = self.policy or self.route.policy
        if self.mode is not None:
            h["x-context-mode"] = self.mode
        if self.mode_rule is not None:
            h["x-context-mode-rule"] = self.mode_rule
        if self.summary is not None:
            h["x-context-summary"] = self.summary.status
            if self.summary.fallback is not None:
                h["x-context-fallback"] = self.summary.fallback
        d = self.decision
        if d is not None:
            h["x-context-tokens-before"] = str(d.tokens_before)
            h["x-context-tokens-after"] = str(d.tokens_after)
            h["x-context-messages-dropped"] = str(len(d.dropped))
            h["x-context-turns-dropped"] = str(d.turns_dropped)
            if d.clipped:
                h["x-context-tool-outputs-clipped"] = str(len(d.clipped))
            if d.masked:
                h["x-context-tool-outputs-masked"] = str(len(d.masked))
            if d.reason:
                h["x-context-trim-reason"] = d.reason
        if self.recall is not None:
            h.update(recall_headers(self.recall))
        if self.stable_prefix is not None:
            h["x-context-stable-prefix"] = str(self.stable_prefix)
        return h

    def _durable(self) -> bool:
        """Whether the exchange is committed before the last byte reaches the client.

        ``history: server``: the next request replays the stored reply, so a
        reply the client saw must survive a crash. Client-held history keeps
        the write off the response path (the client holds the reply).
        """
        return self.ref is not None and self.route is not None and self.route.history == "server"

    def _unlock(self) -> None:
        if self.locked and self.ref is not None:
            self.locked = False
            self.rt.locks.release(self.ref)

    def _stored_conversation(self) -> Sequence[Storable]:
        return self.stored if self.ref is not None and self.stored is not None else []
