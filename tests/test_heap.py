"""IdleTrim: the freed heap goes back to the OS once the proxy is at rest after serving."""

from __future__ import annotations

import openai

from proxy import heap
from proxy.heap import IdleTrim
from tests.harness import wait_until


class Proxy:
    """What IdleTrim looks at: requests served so far and whether any is under way."""

    def __init__(self) -> None:
        self.served = 0
        self.busy = False
        self.trims = 0

    def trim(self) -> bool:
        self.trims += 1
        return True

    def idle_trim(self, min_gap_s: float = 10.0) -> IdleTrim:
        return IdleTrim(lambda: self.served, lambda: self.busy, trim=self.trim, min_gap_s=min_gap_s)


def test_it_trims_once_when_requests_stop_and_not_again_while_idle():
    p = Proxy()
    idle = p.idle_trim()
    p.served = 5
    assert not idle.check(100.0)  # requests came since the last look: not at rest yet
    assert idle.check(100.25)  # a whole look without one: trimmed
    for i in range(20):
        assert not idle.check(100.5 + i)  # idle all along since: nothing more to return
    assert p.trims == 1


def test_a_proxy_that_never_served_never_trims():
    p = Proxy()
    idle = p.idle_trim()
    assert not any(idle.check(float(t)) for t in range(30))
    assert p.trims == 0


def test_it_does_not_trim_while_requests_keep_coming_or_are_in_flight():
    p = Proxy()
    idle = p.idle_trim()
    for t in range(10):
        p.served += 1
        assert not idle.check(float(t))
    p.busy = True  # a long request (or a pending write) with no new one started
    assert not idle.check(10.0) and not idle.check(11.0)
    p.busy = False
    assert idle.check(12.0)
    assert p.trims == 1


def test_it_trims_at_most_once_per_gap_then_at_the_next_rest():
    p = Proxy()
    idle = p.idle_trim(min_gap_s=10.0)
    p.served = 1
    idle.check(0.0)
    assert idle.check(0.25)
    p.served = 2  # a short burst soon after
    idle.check(1.0)
    assert not idle.check(1.25)  # at rest, but within the gap
    assert not idle.check(5.0)
    assert idle.check(10.5)  # the gap passed, still at rest since: trimmed then
    assert p.trims == 2


def test_the_proxy_trims_once_at_rest_after_serving(start_proxy, monkeypatch):
    """Real HTTP: requests served, then quiet: the app's IdleTrim returns the heap once."""
    trims: list[int] = []
    monkeypatch.setattr(heap, "release_freed_heap", lambda: trims.append(1) or True)
    proxy = start_proxy()
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0)
    for i in range(3):
        client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": f"hello {i}"}],
            extra_headers={"X-Session-Id": "heap"},
        )
    wait_until(lambda: len(trims) >= 1)
    assert len(trims) == 1
