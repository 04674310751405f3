"""Token calibration: local counts vs the upstream's usage.prompt_tokens, applied to budgets."""

from __future__ import annotations

import random
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.types import TrimSpec
from proxy.context.calibration import Calibration
from proxy.context.rewriter import Rewriter
from proxy.context.tokens import counter_for
from tests.fakes.upstream import Reply
from tests.telemetry.test_metrics import parse, value


def test_factor_converges_on_the_reported_ratio():
    cal = Calibration()
    rng = random.Random(7)
    for _ in range(30):
        local = rng.randint(50, 3000)
        cal.observe("claude", local, round(local * 1.1))
    assert cal.factor("claude") == pytest.approx(1.1, abs=0.002)
    [entry] = cal.snapshot()
    assert (entry["model"], entry["samples"], entry["applied"]) == ("claude", 30, True)


def test_factor_applies_only_after_enough_samples():
    cal = Calibration(min_samples=5)
    for n in range(1, 6):
        cal.observe("m", 1000, 1200)
        assert cal.factor("m") == (1.2 if n == 5 else 1.0)
    assert cal.factor("unknown") == 1.0


def test_factor_applies_from_the_first_answer_by_default():
    cal = Calibration()
    cal.observe("m", 1000, 1090)
    assert cal.factor("m") == pytest.approx(1.09)


def test_factor_belongs_to_the_model_that_answered_not_the_name_sent():
    cal = Calibration()
    # llama.cpp answers every name as the one model it serves.
    cal.observe_usage(
        "gemma", 1000, {"prompt_tokens": 1100}, upstream="local", answered_as="g.gguf"
    )
    assert cal.factor("gemma", "local") == pytest.approx(1.1)
    # A name never sent before reaches the same model: the same factor, at once.
    assert cal.factor("my-new-name", "local") == pytest.approx(1.1)
    # Another upstream's model of that name is another model.
    assert cal.factor("gemma", "openai") == 1.0
    [entry] = cal.snapshot()
    assert (entry["upstream"], entry["model"], entry["client_models"]) == (
        "local",
        "g.gguf",
        ["gemma"],
    )


def test_an_upstream_serving_several_models_keeps_them_apart():
    cal = Calibration()
    cal.observe_usage("a", 1000, {"prompt_tokens": 1100}, upstream="u", answered_as="a-1")
    cal.observe_usage("b", 1000, {"prompt_tokens": 1300}, upstream="u", answered_as="b-1")
    assert cal.factor("a", "u") == pytest.approx(1.1)
    assert cal.factor("b", "u") == pytest.approx(1.3)
    # Which of the two a new name reaches is unknown: uncalibrated until it answers.
    assert cal.factor("c", "u") == 1.0


def test_factor_follows_a_changed_tokenizer():
    cal = Calibration()
    for _ in range(20):
        cal.observe("m", 1000, 1100)
    for _ in range(30):
        cal.observe("m", 1000, 1300)
    assert cal.factor("m") == pytest.approx(1.3, abs=0.01)


@pytest.mark.parametrize(("reported", "factor"), [(10_000, 2.0), (100, 0.5)])
def test_factor_is_clamped_to_a_sane_range(reported, factor):
    cal = Calibration()
    for _ in range(10):
        cal.observe("m", 1000, reported)
    assert cal.factor("m") == factor


@pytest.mark.parametrize(
    "usage",
    [
        None,
        {},
        {"prompt_tokens": 0},
        {"prompt_tokens": -3},
        {"prompt_tokens": True},
        {"prompt_tokens": "12"},
        [1],
    ],
)
def test_unusable_usage_is_ignored(usage):
    cal = Calibration(min_samples=1)
    cal.observe_usage("m", 100, usage)
    cal.observe_usage(None, 100, {"prompt_tokens": 100})
    cal.observe_usage("m", 0, {"prompt_tokens": 100})
    assert cal.snapshot() == []


def test_tracked_models_are_bounded():
    cal = Calibration(max_models=2, min_samples=1)
    for model in ("a", "b", "c"):
        cal.observe(model, 100, 150)
    assert [e["model"] for e in cal.snapshot()] == ["a", "b"]
    assert cal.factor("c") == 1.0


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.integers(1, 100_000), st.integers(1, 200_000)), min_size=5, max_size=40)
)
def test_factor_stays_between_the_observed_ratios_and_the_clamp(samples):
    cal = Calibration()
    for local, reported in samples:
        cal.observe("m", local, reported)
    ratios = [min(2.0, max(0.5, r / loc)) for loc, r in samples]
    assert 0.5 <= cal.factor("m") <= 2.0
    assert min(ratios) - 1e-9 <= cal.factor("m") <= max(ratios) + 1e-9


def chat_of(total: int, model: str = "gpt-4o") -> list[dict[str, Any]]:
    """A conversation whose local count (messages plus priming) is exactly ``total``."""
    counter = counter_for(model)

    def cost(messages: list[dict[str, Any]]) -> int:
        return counter.count_messages(messages) + counter.count_request_fixed({"model": model})

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    t = 0
    while cost([*messages, {"role": "user", "content": "q"}]) + 60 < total:
        messages += [
            {"role": "user", "content": f"question {t} " + "word " * 20},
            {"role": "assistant", "content": f"answer {t} " + "word " * 20},
        ]
        t += 1
    last = "q"
    while cost([*messages, {"role": "user", "content": last + " word"}]) <= total:
        last += " word"
    messages.append({"role": "user", "content": last})
    assert cost(messages) == total
    return messages


def test_rewriter_divides_the_budget_so_the_upstream_count_fits():
    limit = 600
    messages = chat_of(limit)
    policies = {"fit": TrimSpec(max_tokens=limit)}
    plain = Rewriter(policies).decide("fit", messages, {}, "gpt-4o")
    # Uncalibrated, everything fits locally, and the upstream would count 10% over.
    assert plain.tokens_after == limit and not plain.dropped
    assert round(plain.tokens_after * 1.1) > limit
    calibrated = Rewriter(policies, lambda model, upstream: 1.1).decide(
        "fit", messages, {}, "gpt-4o"
    )
    assert calibrated.budget == int(limit / 1.1)
    assert calibrated.extra["calibration"] == 1.1
    assert calibrated.dropped and round(calibrated.tokens_after * 1.1) <= limit
    # Counts stay local: the same conversation reports the same tokens before.
    assert calibrated.tokens_before == plain.tokens_before


def fit_proxy(start_proxy: Any, limit: int) -> tuple[Any, openai.OpenAI]:
    """A proxy whose one route trims to ``limit`` tokens, and a client of it."""
    proxy = start_proxy(
        policies={"fit": {"strategy": "trim", "max_tokens": limit}},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fit"}
        ],
    )
    return proxy, openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="k", max_retries=0)


def test_calibration_converges_through_the_proxy_and_budgets_hold(fake, start_proxy):
    upstream, _ = fake
    upstream.prompt_token_factor = 1.1
    limit = 600
    proxy, client = fit_proxy(start_proxy, limit)
    for n in range(6):
        # Small conversations the budget does not touch: pure measurement.
        client.chat.completions.create(model="gpt-4o", messages=chat_of(200 + 40 * n))
    proxy.drain()
    samples = parse(httpx.get(f"{proxy.url}/metrics").text)
    labels = {"upstream": "default", "model": "gpt-4o"}
    factor = value(samples, "ctxproxy_token_calibration_factor", **labels)
    assert factor == pytest.approx(1.1, abs=0.01)
    assert value(samples, "ctxproxy_token_calibration_samples", **labels) == 6
    # A conversation that fits the budget by tiktoken's count but not by the upstream's.
    raw = client.chat.completions.with_raw_response.create(model="gpt-4o", messages=chat_of(limit))
    assert int(raw.headers["x-context-tokens-before"]) == limit
    assert int(raw.headers["x-context-messages-dropped"]) > 0
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens <= limit


def test_a_new_model_name_is_calibrated_from_the_upstreams_first_answer(fake, start_proxy):
    """A local server answers any name as its one model: the first answer, under
    another name, already holds the next request's budget in the server's tokens."""
    upstream, _ = fake
    upstream.prompt_token_factor = 1.2
    upstream.served_model = "gemma-3-270m-q4_k_m.gguf"
    limit = 600
    proxy, client = fit_proxy(start_proxy, limit)
    client.chat.completions.create(model="local", messages=chat_of(300))
    proxy.drain()
    raw = client.chat.completions.with_raw_response.create(
        model="another-name", messages=chat_of(limit)
    )
    assert int(raw.headers["x-context-messages-dropped"]) > 0
    completion = raw.parse()
    assert completion.usage is not None and completion.usage.prompt_tokens <= limit


@pytest.mark.parametrize("server_counts", [True, False])
def test_a_stream_without_usage_is_counted_by_the_server_for_calibration(
    fake, start_proxy, server_counts
):
    """llama-cpp-python streams no usage: the answer is counted by its tokenizer."""
    upstream, _ = fake
    upstream.prompt_token_factor = 1.25
    upstream.tokenize = server_counts
    upstream.replies += [Reply(content="The answer, at some length: " + "token " * 60)] * 2
    proxy, client = fit_proxy(start_proxy, 600)
    for _ in range(2):
        stream = client.chat.completions.create(model="local", messages=chat_of(200), stream=True)
        list(stream)
        proxy.drain()
    snapshot = proxy.runtime.calibration.snapshot()
    asked = [r.path for r in upstream.received].count("/extras/tokenize/count")
    if server_counts:
        [entry] = snapshot
        assert entry["samples"] == 2 and entry["factor"] == pytest.approx(1.25, abs=0.02)
        assert asked == 2
    else:
        assert snapshot == []
        assert asked == 1  # a server without the endpoint is not asked again


def test_a_server_listing_one_model_calibrates_every_name_it_is_sent_as_that_one():
    """llama-cpp-python echoes whatever name it is sent, and lists its one model."""
    cal = Calibration()
    for name in ("a", "b"):
        cal.observe_usage(name, 1000, {"prompt_tokens": 1200}, upstream="local", answered_as=name)
    assert cal.ambiguous("local")
    assert cal.factor("c", "local") == 1.0  # two "models" answered: which is c?
    cal.serves("local", ["/models/gemma.gguf"])
    assert not cal.ambiguous("local")
    # The samples kept under the echoed names are that model's.
    assert cal.factor("c", "local") == pytest.approx(1.2)
    [entry] = cal.snapshot()
    assert (entry["model"], entry["samples"], entry["client_models"]) == (
        "/models/gemma.gguf",
        2,
        ["a", "b"],
    )
    cal.observe_usage("c", 1000, {"prompt_tokens": 1200}, upstream="local", answered_as="c")
    assert cal.factor("d", "local") == pytest.approx(1.2)
    # A server listing several models tells nothing about a name.
    cal.serves("hosted", ["m1", "m2"])
    assert cal.factor("m3", "hosted") == 1.0
