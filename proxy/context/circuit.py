"""A circuit breaker per route for the summarizer: stop calling one that keeps failing.

Without it a summarizer that is down (or a model that rejects every call)
costs every request an extra failing call and its wait before the trimming
fallback serves it. After ``THRESHOLD`` consecutive failed calls for a
route the circuit opens: for ``COOLDOWN_S`` no call is made and requests go
straight to the trimming fallback, marked ``X-Context-Fallback:
summarizer_unavailable``. Then one trial call is let through (half-open):
a success closes the circuit, a failure opens it again for twice as long,
up to ``MAX_COOLDOWN_S``. Any success resets the count. State is
per process and in memory: a restart gives every summarizer a fresh chance.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.telemetry.logging import get_logger
from proxy.telemetry.metrics import CallbackGauge, Counter, Metrics

log = get_logger()

THRESHOLD = 3
COOLDOWN_S = 30.0
MAX_COOLDOWN_S = 300.0


@dataclass
class _State:
    failures: int = 0
    open_until: float | None = None
    cooldown_s: float = COOLDOWN_S
    trial: bool = False  # a half-open trial call is in flight


@dataclass
class Breaker:
    threshold: int = THRESHOLD
    cooldown_s: float = COOLDOWN_S
    max_cooldown_s: float = MAX_COOLDOWN_S
    clock: Callable[[], float] = time.monotonic
    _routes: dict[str, _State] = field(default_factory=dict)
    opened: Counter | None = None

    def register(self, metrics: Metrics) -> None:
        self.opened = Counter(
            "ctxproxy_summarizer_circuit_opened_total",
            "Times a route's summarizer circuit opened after repeated failures.",
            ("route",),
        )
        metrics.registry.add(self.opened)
        metrics.registry.add(
            CallbackGauge(
                "ctxproxy_summarizer_circuit_open",
                "1 while a route's summarizer circuit is open (no summarizer calls made).",
                ("route",),
                lambda: [((route or "none",), 1.0) for route in self.open_routes()],
            )
        )

    def open_routes(self) -> list[str]:
        now = self.clock()
        return [
            r for r, s in self._routes.items() if s.open_until is not None and now < s.open_until
        ]

    def allow(self, route: str) -> bool:
        """May a summarizer call be made for this route now? (Half-open: one trial at a time.)"""
        state = self._routes.get(route)
        if state is None or state.open_until is None:
            return True
        if self.clock() < state.open_until or state.trial:
            return False
        state.trial = True
        return True

    def success(self, route: str) -> None:
        state = self._routes.pop(route, None)
        if state is not None and state.open_until is not None:
            log.info("summarizer_circuit_closed", route=route)

    def failure(self, route: str) -> None:
        state = self._routes.setdefault(route, _State(cooldown_s=self.cooldown_s))
        state.failures += 1
        if state.open_until is not None:  # the trial failed: open again, for longer
            state.trial = False
            state.cooldown_s = min(state.cooldown_s * 2, self.max_cooldown_s)
        elif state.failures < self.threshold:
            return
        state.open_until = self.clock() + state.cooldown_s
        if self.opened is not None:
            self.opened.inc((route or "none",))
        log.warning(
            "summarizer_circuit_opened",
            route=route,
            failures=state.failures,
            cooldown_s=state.cooldown_s,
        )
