"""The summarizer's circuit breaker: open after repeated failures, one trial after the cool-down."""

from __future__ import annotations

from proxy.context.circuit import Breaker
from proxy.telemetry.metrics import Metrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_threshold_consecutive_failures_only():
    breaker = Breaker(threshold=3, cooldown_s=30, clock=Clock())
    for _ in range(2):
        breaker.failure("r")
    breaker.success("r")  # a success resets the count
    for _ in range(2):
        breaker.failure("r")
    assert breaker.allow("r")
    breaker.failure("r")
    assert not breaker.allow("r")
    assert breaker.allow("other-route")  # per route


def test_half_open_lets_one_trial_through_and_closes_on_success():
    clock = Clock()
    breaker = Breaker(threshold=1, cooldown_s=30, clock=clock)
    breaker.failure("r")
    clock.now += 29
    assert not breaker.allow("r")
    clock.now += 2
    assert breaker.allow("r")  # the trial
    assert not breaker.allow("r")  # one at a time
    breaker.success("r")
    assert breaker.allow("r") and breaker.allow("r")


def test_a_failed_trial_reopens_for_twice_as_long_up_to_the_cap():
    clock = Clock()
    breaker = Breaker(threshold=1, cooldown_s=30, max_cooldown_s=100, clock=clock)
    breaker.failure("r")
    waits = []
    for _ in range(4):
        start = clock.now
        while not breaker.allow("r"):
            clock.now += 1
        waits.append(clock.now - start)
        breaker.failure("r")
    assert waits == [30, 60, 100, 100]


def test_metrics_show_open_circuits_and_openings():
    clock = Clock()
    metrics = Metrics()
    breaker = Breaker(threshold=1, cooldown_s=30, clock=clock)
    breaker.register(metrics)
    breaker.failure("support")
    text = metrics.render()
    assert 'ctxproxy_summarizer_circuit_opened_total{route="support"} 1' in text
    assert 'ctxproxy_summarizer_circuit_open{route="support"} 1' in text
    clock.now += 31
    assert 'ctxproxy_summarizer_circuit_open{route="support"}' not in metrics.render()
