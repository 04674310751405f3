"""proxy/context/summarizer.py: the LLM summarizer's call and failures, the offline stand-in."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from proxy.config.model import UpstreamConfig
from proxy.context.summaries import build_summarizer
from proxy.context.summarizer import (
    DEFAULT_PROMPT,
    EXTRACTIVE_MODEL,
    SUMMARIZER_HEADER,
    ExtractiveSummarizer,
    LLMSummarizer,
    SummaryFailed,
    SummaryRequest,
    prompt_hash,
    request_messages,
)
from proxy.errors import UpstreamError, UpstreamTimeout
from proxy.upstream.base import UpstreamRequest


class Answer:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.headers: list[tuple[str, str]] = []
        self.body = body
        self.closed = False

    async def read(self) -> bytes:
        return self.body

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        yield self.body

    async def close(self) -> None:
        self.closed = True


class FakeUpstream:
    """An Upstream that records requests and answers as scripted (no network)."""

    def __init__(self, answer: Any = None, delay: float = 0.0) -> None:
        self.sent: list[UpstreamRequest] = []
        self.answer = answer if answer is not None else completion("the summary")
        self.delay = delay
        self.answers: list[Answer] = []

    async def send(self, request: UpstreamRequest) -> Answer:
        self.sent.append(request)
        await asyncio.sleep(self.delay)
        if isinstance(self.answer, Exception):
            raise self.answer
        self.answers.append(self.answer)
        return self.answer

    async def close(self) -> None:
        return None


def completion(content: Any, status: int = 200) -> Answer:
    body = {
        "id": "c1",
        "model": "gpt-4o-mini-2024",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59},
    }
    return Answer(status, orjson.dumps(body))


REQUEST = SummaryRequest(previous=None, transcript="[user]\norder #1 is late", max_tokens=123)


async def test_one_call_at_temperature_zero_with_the_prompt_and_the_turns():
    upstream = FakeUpstream()
    summarizer = LLMSummarizer(
        upstream, model="gpt-4o-mini", headers={"authorization": "Bearer sk-x"}
    )
    out = await summarizer.summarize(REQUEST)
    assert out.text == "the summary" and out.model == "gpt-4o-mini-2024"
    assert out.usage == {"prompt_tokens": 50, "completion_tokens": 9, "total_tokens": 59}
    (sent,) = upstream.sent
    assert (sent.method, sent.path) == ("POST", "/chat/completions")
    assert sent.headers["authorization"] == "Bearer sk-x"
    assert sent.headers[SUMMARIZER_HEADER] == "1"
    assert sent.body is not None and orjson.loads(sent.body) == sent.json
    body = sent.json
    assert body is not None
    assert body["model"] == "gpt-4o-mini" and body["temperature"] == 0
    assert body["max_tokens"] == 123 and body["stream"] is False
    system, user = body["messages"]
    assert system == {"role": "system", "content": DEFAULT_PROMPT}
    assert "order #1 is late" in user["content"] and "123 tokens" in user["content"]
    assert upstream.answers[0].closed


def test_an_incremental_request_carries_the_previous_summary():
    request = SummaryRequest(previous="- they met", transcript="[user]\nhi", max_tokens=10)
    _, user = request_messages("P", request)
    assert "The summary so far:\n<summary>\n- they met\n</summary>" in user["content"]
    assert "updated summary" in user["content"]


def test_the_default_prompt_asks_for_the_issues_sections_and_rules():
    for needle in (
        "Goal and context",
        "Reported problem",
        "Steps tried",
        "Identifiers",
        "Timeline",
        "Current status and blockers",
        "Next step",
        "UNVERIFIED",
        "superseded",
        "Invent nothing",
    ):
        assert needle in DEFAULT_PROMPT


def test_prompt_hashes_identify_the_prompt():
    assert prompt_hash("a") == prompt_hash("a") != prompt_hash("b")
    custom = LLMSummarizer(FakeUpstream(), model="m", prompt="Be terse.")
    assert custom.prompt_hash == prompt_hash("Be terse.")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (completion("x", status=500), "error"),
        (completion("   "), "empty"),
        (completion(None), "empty"),
        (Answer(200, b"not json"), "error"),
        (Answer(200, b'{"choices": []}'), "error"),
        (UpstreamError("refused"), "error"),
        (UpstreamTimeout("slow"), "timeout"),
    ],
)
async def test_anything_but_a_non_empty_answer_is_a_failure_with_a_reason(answer, reason):
    summarizer = LLMSummarizer(FakeUpstream(answer), model="m")
    with pytest.raises(SummaryFailed) as info:
        await summarizer.summarize(REQUEST)
    assert info.value.reason == reason


async def test_a_slow_summarizer_times_out():
    summarizer = LLMSummarizer(FakeUpstream(delay=1.0), model="m", timeout_s=0.05)
    with pytest.raises(SummaryFailed) as info:
        await summarizer.summarize(REQUEST)
    assert info.value.reason == "timeout"


TRANSCRIPT = "\n\n".join(
    [
        "[user]\nMy order #1 is late. It was due Monday.",
        "[assistant called tool track]\n{}",
        "[tool result call_1]\nin transit",
        "[assistant]\nIt is in transit. Anything else?",
    ]
)


def test_the_extractive_stand_in_quotes_first_sentences_and_skips_tool_data():
    out = ExtractiveSummarizer().make(SummaryRequest(None, TRANSCRIPT, 200))
    assert out.text.splitlines() == [
        "- user: My order #1 is late.",
        "- assistant: It is in transit.",
    ]
    assert out.model == EXTRACTIVE_MODEL


def test_the_extractive_stand_in_is_incremental_and_keeps_the_newest_within_budget():
    first = ExtractiveSummarizer().make(SummaryRequest(None, TRANSCRIPT, 200)).text
    more = "[user]\nWhere is it now? Please check."
    out = ExtractiveSummarizer(count_text=lambda t: 10).make(SummaryRequest(first, more, 20))
    assert out.text.splitlines() == ["- assistant: It is in transit.", "- user: Where is it now?"]


def test_the_extractive_stand_in_fails_when_nothing_fits():
    with pytest.raises(SummaryFailed) as info:
        ExtractiveSummarizer(count_text=lambda t: 100).make(SummaryRequest(None, TRANSCRIPT, 5))
    assert info.value.reason == "empty"


UPSTREAMS = {
    "default": UpstreamConfig(name="default", base_url="http://127.0.0.1:9/v1"),
    "keyed": UpstreamConfig(
        name="keyed", base_url="http://127.0.0.1:9/v1", api_key="sk-conf", headers={"X-Org": "o"}
    ),
}


def build(spec_model: str | None = None, upstream: str | None = None) -> Any:
    from policies.types import SummarizerSpec

    return build_summarizer(
        SummarizerSpec(model=spec_model, upstream=upstream, timeout_s=3),
        model="gpt-4o",
        upstream="default",
        upstream_configs=UPSTREAMS,
        upstreams={"default": FakeUpstream(), "keyed": FakeUpstream()},
        client_headers={"authorization": "Bearer sk-client"},
        count=lambda m: len(str(m.get("content"))),
    )


def test_the_summarizer_defaults_to_the_requests_model_and_the_clients_key():
    s = build()
    assert isinstance(s, LLMSummarizer)
    assert s.model == "gpt-4o" and s.timeout_s == 3
    assert s.headers["authorization"] == "Bearer sk-client"


def test_a_configured_upstream_uses_its_own_key_and_headers():
    s = build("gpt-4o-mini", "keyed")
    assert isinstance(s, LLMSummarizer)
    assert s.model == "gpt-4o-mini"
    assert s.headers["authorization"] == "Bearer sk-conf" and s.headers["x-org"] == "o"


def test_the_extractive_model_name_needs_no_upstream():
    assert isinstance(build(EXTRACTIVE_MODEL), ExtractiveSummarizer)


@pytest.mark.parametrize("model", ["gpt-5", "o3", "o4-mini", "gpt-5-mini"])
async def test_reasoning_models_get_only_what_they_accept(model):
    """o-series and gpt-5 reject temperature and max_tokens: neither is sent."""
    upstream = FakeUpstream()
    out = await LLMSummarizer(upstream, model=model).summarize(REQUEST)
    assert out.text == "the summary"
    body = orjson.loads(upstream.sent[0].body or b"")
    assert "temperature" not in body and "max_tokens" not in body
    assert body["max_completion_tokens"] >= REQUEST.max_tokens
    assert body["reasoning_effort"] in ("minimal", "low")
