"""LitellmUpstream against a fake Anthropic Messages endpoint on loopback."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

# Before anything imports litellm: no price-map download, tiktoken offline.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
_spec = importlib.util.find_spec("litellm")
assert _spec is not None and _spec.origin is not None
os.environ.setdefault(
    "TIKTOKEN_CACHE_DIR",
    str(Path(_spec.origin).parent / "litellm_core_utils" / "tokenizers"),
)

import orjson  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from proxy.errors import UpstreamError, UpstreamTimeout  # noqa: E402
from proxy.upstream.base import UpstreamRequest, UpstreamResponse  # noqa: E402
from proxy.upstream.litellm_support import own_body, provider_message  # noqa: E402
from proxy.upstream.provider import LitellmUpstream, error_body  # noqa: E402
from tests.fakes.anthropic import FakeAnthropic, Reply, closed_port, sse_events  # noqa: E402

# litellm builds some pydantic schemas lazily, on the first stream; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")

MODEL = "anthropic/claude-sonnet-4-5"
CLIENT_MODEL = "my-claude"
REPO = Path(__file__).resolve().parents[2]

CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather for a city.", "parameters": CITY},
}


@pytest.fixture
async def fake() -> AsyncIterator[FakeAnthropic]:
    async with FakeAnthropic() as server:
        yield server


@pytest.fixture
async def upstream(fake: FakeAnthropic) -> AsyncIterator[LitellmUpstream]:
    up = LitellmUpstream(MODEL, api_base=fake.url, api_key="sk-configured", timeout_s=5)
    yield up
    await up.close()


def chat(
    body: dict[str, Any], *, headers: dict[str, str] | None = None, path: str = "/chat/completions"
) -> UpstreamRequest:
    full = {"model": CLIENT_MODEL, **body}
    return UpstreamRequest(
        method="POST",
        path=path,
        headers=headers or {},
        body=orjson.dumps(full),
        json=full,
        stream=bool(full.get("stream")),
    )


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


async def chunks_of(response: UpstreamResponse) -> list[bytes]:
    return [chunk async for chunk in response.iter_chunks()]


# -- translation ----------------------------------------------------------------


async def test_non_streaming_round_trip_translates_both_ways(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    fake.script(Reply(text="Bonjour!", input_tokens=21, output_tokens=3))
    body = {
        "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Say hello."},
        ],
        "max_tokens": 50,
    }
    response = await upstream.send(chat(body))

    [sent] = fake.requests
    assert sent.path == "/v1/messages"
    assert sent.json["model"] == "claude-sonnet-4-5"
    assert sent.json["max_tokens"] == 50
    assert sent.json["system"] == [{"type": "text", "text": "Answer in French."}]
    assert sent.json["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Say hello."}]}
    ]
    assert "stream" not in sent.json

    assert response.status == 200
    assert ("content-type", "application/json") in response.headers
    completion = orjson.loads(await response.read())
    assert completion["object"] == "chat.completion"
    assert completion["model"] == CLIENT_MODEL
    message, usage = completion["choices"][0]["message"], completion["usage"]
    assert (message["role"], message["content"]) == ("assistant", "Bonjour!")
    assert completion["choices"][0]["finish_reason"] == "stop"
    assert [usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")] == [21, 3, 24]


async def test_streaming_yields_openai_chunks_ending_with_done(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    pieces = ("Once ", "upon ", "a ", "time", ".")
    fake.script(Reply(text="".join(pieces), pieces=pieces))
    response = await upstream.send(chat({**user("A story?"), "stream": True}))

    assert response.status == 200
    assert ("content-type", "text/event-stream") in response.headers
    chunks = await chunks_of(response)
    assert chunks[-1] == b"data: [DONE]\n\n"
    parsed = sse_events(chunks)
    assert all(e["object"] == "chat.completion.chunk" for e in parsed)
    assert all(e["model"] == CLIENT_MODEL for e in parsed)
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in parsed if e["choices"])
    assert text == "Once upon a time."
    assert [e["choices"][0]["finish_reason"] for e in parsed if e["choices"]][-1] == "stop"
    assert fake.requests[0].json["stream"] is True


async def test_stream_usage_only_when_include_usage_is_asked(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    fake.script(Reply(input_tokens=13, output_tokens=5), Reply())
    with_usage = {**user("hi"), "stream": True, "stream_options": {"include_usage": True}}
    asked = sse_events(await chunks_of(await upstream.send(chat(with_usage))))
    not_asked = sse_events(
        await chunks_of(await upstream.send(chat({**user("hi"), "stream": True})))
    )

    usages = [e["usage"] for e in asked if e.get("usage")]
    assert len(usages) == 1
    assert (usages[0]["prompt_tokens"], usages[0]["completion_tokens"]) == (13, 5)
    assert not [e for e in not_asked if e.get("usage")]


async def test_tool_call_round_trip(fake: FakeAnthropic, upstream: LitellmUpstream) -> None:
    fake.script(Reply.tool("get_weather", {"city": "Paris"}))
    body = {**user("Weather in Paris?"), "tools": [WEATHER_TOOL], "tool_choice": "auto"}
    completion = orjson.loads(await (await upstream.send(chat(body))).read())

    [tool] = fake.requests[0].json["tools"]
    assert (tool["name"], tool["input_schema"]) == ("get_weather", CITY)
    choice = completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    [call] = choice["message"]["tool_calls"]
    assert call["id"] == "toolu_fake_01"
    assert call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "Paris"}

    follow_up = {
        "messages": [
            *body["messages"],
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "18C and sunny"},
        ],
        "tools": [WEATHER_TOOL],
    }
    response = await upstream.send(chat(follow_up))
    assert response.status == 200
    _, assistant, tool_turn = fake.requests[1].json["messages"]
    tool_use = assistant["content"][-1]
    assert assistant["role"] == "assistant"
    assert (tool_use["type"], tool_use["id"], tool_use["input"]) == (
        "tool_use",
        "toolu_fake_01",
        {"city": "Paris"},
    )
    [result] = [b for b in tool_turn["content"] if b["type"] == "tool_result"]
    assert tool_turn["role"] == "user"
    assert result["tool_use_id"] == "toolu_fake_01"
    assert "18C and sunny" in orjson.dumps(result["content"]).decode()


async def test_streamed_tool_call_arguments_assemble_to_the_input(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    arguments = {"city": "Reykjavik", "units": "metric"}
    fake.script(Reply.tool("get_weather", arguments))
    body = {**user("Weather?"), "tools": [WEATHER_TOOL], "stream": True}
    parsed = sse_events(await chunks_of(await upstream.send(chat(body))))

    deltas = [e["choices"][0]["delta"] for e in parsed if e["choices"]]
    calls = [call for delta in deltas for call in delta["tool_calls"] or ()]
    assert {c["function"]["name"] for c in calls if c["function"].get("name")} == {"get_weather"}
    assembled = "".join(c["function"].get("arguments") or "" for c in calls)
    assert orjson.loads(assembled) == arguments
    assert [e["choices"][0]["finish_reason"] for e in parsed if e["choices"]][-1] == "tool_calls"


# -- what reaches the provider ----------------------------------------------------


async def test_client_bearer_key_is_forwarded_when_no_key_is_configured(
    fake: FakeAnthropic,
) -> None:
    up = LitellmUpstream(MODEL, api_base=fake.url, api_key=None, timeout_s=5)
    await up.send(chat(user("hi"), headers={"authorization": "Bearer sk-client"}))
    assert fake.requests[0].headers["x-api-key"] == "sk-client"


async def test_configured_key_replaces_the_client_key(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    await upstream.send(chat(user("hi"), headers={"Authorization": "Bearer sk-client"}))
    headers = fake.requests[0].headers
    assert headers["x-api-key"] == "sk-configured"
    assert "sk-client" not in str(headers)


async def test_client_cannot_steer_litellm_through_body_fields(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    body = {
        **user("hi"),
        "api_base": f"http://127.0.0.1:{closed_port()}",
        "base_url": f"http://127.0.0.1:{closed_port()}",
        "api_key": "sk-attacker",
        "extra_headers": {"x-api-key": "sk-attacker"},
        "mock_response": "mocked",
        "num_retries": 5,
    }
    response = await upstream.send(chat(body))

    assert response.status == 200
    [sent] = fake.requests
    assert sent.headers["x-api-key"] == "sk-configured"
    completion = orjson.loads(await response.read())
    assert completion["choices"][0]["message"]["content"] == Reply().text


async def test_openai_fields_the_provider_lacks_are_dropped_not_fatal(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    body = {**user("hi"), "logit_bias": {"50256": -100}, "presence_penalty": 0.5, "seed": 1}
    response = await upstream.send(chat(body))
    assert response.status == 200
    sent = fake.requests[0].json
    assert not {"logit_bias", "presence_penalty", "seed"} & sent.keys()


async def test_other_paths_answer_404_without_calling_the_provider(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    response = await upstream.send(chat(user("hi"), path="/audio/speech"))
    assert response.status == 404
    error = orjson.loads(await response.read())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "/audio/speech" in error["message"]
    assert fake.requests == []


async def test_extra_kwargs_reach_litellm_over_the_client_values(fake: FakeAnthropic) -> None:
    up = LitellmUpstream(MODEL, api_base=fake.url, api_key="k", timeout_s=5, extra={"top_k": 3})
    await up.send(chat({**user("hi"), "top_k": 40, "max_tokens": 9}))
    assert (fake.requests[0].json["top_k"], fake.requests[0].json["max_tokens"]) == (3, 9)


def test_extra_may_not_override_what_the_upstream_controls() -> None:
    with pytest.raises(ValueError, match="api_base"):
        LitellmUpstream(MODEL, api_base=None, api_key=None, timeout_s=1, extra={"api_base": "x"})


# -- errors -------------------------------------------------------------------------


STREAM = pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])


@STREAM
@pytest.mark.parametrize(
    ("status", "kind"),
    [(429, "rate_limit_error"), (400, "invalid_request_error"), (401, "authentication_error")],
)
async def test_provider_error_status_is_relayed_with_an_openai_body(
    fake: FakeAnthropic, upstream: LitellmUpstream, stream: bool, status: int, kind: str
) -> None:
    # Anthropic's error types for these statuses happen to be OpenAI's too.
    fake.script(Reply.error(status, kind, f"provider says {status}"))
    response = await upstream.send(chat({**user("hi"), "stream": stream}))

    assert response.status == status
    assert ("content-type", "application/json") in response.headers
    body = orjson.loads(await response.read())
    assert body["error"]["message"] == f"provider says {status}"
    assert body["error"]["type"] == kind
    assert set(body["error"]) == {"message", "type", "param", "code"}


async def test_rate_limit_relays_retry_after(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    fake.script(Reply.error(429, "rate_limit_error", "slow down", retry_after="7"))
    response = await upstream.send(chat(user("hi")))
    assert ("retry-after", "7") in response.headers


async def test_overloaded_keeps_the_provider_status(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    # litellm reports Anthropic's 529 as a 500; the provider's own status is kept.
    fake.script(Reply.error(529, "overloaded_error", "Overloaded"))
    response = await upstream.send(chat(user("hi")))
    assert response.status == 529
    assert orjson.loads(await response.read())["error"]["type"] == "server_error"


@STREAM
async def test_unreachable_api_base_raises_upstream_error(stream: bool) -> None:
    nowhere = f"http://127.0.0.1:{closed_port()}"
    up = LitellmUpstream(MODEL, api_base=nowhere, api_key="k", timeout_s=5, name="claude")
    with pytest.raises(UpstreamError) as caught:
        await up.send(chat({**user("hi"), "stream": stream}))
    assert not isinstance(caught.value, UpstreamTimeout)
    # The error names the upstream and its host (in the client's answer and the log).
    assert caught.value.message.startswith(f"Upstream 'claude' ({nowhere.removeprefix('http://')})")


def test_a_timeout_litellm_reports_as_a_500_still_raises_upstream_timeout(
    upstream: LitellmUpstream,
) -> None:
    # As with a refused connection, litellm can fold a transport timeout into
    # an InternalServerError; the cause chain tells what really happened.
    import httpx
    from litellm.exceptions import InternalServerError

    folded = InternalServerError(message="boom", llm_provider="anthropic", model=MODEL)
    folded.__context__ = httpx.ConnectTimeout("connect timed out")
    with pytest.raises(UpstreamTimeout):
        upstream._failure(folded)


@STREAM
async def test_slow_provider_raises_upstream_timeout(fake: FakeAnthropic, stream: bool) -> None:
    fake.script(Reply(delay_s=1.0))
    up = LitellmUpstream(MODEL, api_base=fake.url, api_key="k", timeout_s=0.2)
    with pytest.raises(UpstreamTimeout):
        await up.send(chat({**user("hi"), "stream": stream}))


async def test_stream_error_before_any_content_becomes_a_status_and_body(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    fake.script(Reply(text="", stream_error=("overloaded_error", "Overloaded")))
    response = await upstream.send(chat({**user("hi"), "stream": True}))
    assert response.status == 529  # Anthropic's "overloaded", as the whole-answer case
    assert ("content-type", "application/json") in response.headers
    error = orjson.loads(await response.read())["error"]
    assert error["message"] == "Overloaded"
    assert error["type"] == "server_error"


async def test_error_after_the_first_chunk_raises_from_iter_chunks(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    fake.script(Reply(text="partial answer", stream_error=("overloaded_error", "Overloaded")))
    response = await upstream.send(chat({**user("hi"), "stream": True}))
    assert response.status == 200
    received: list[bytes] = []
    with pytest.raises(UpstreamError):
        async for chunk in response.iter_chunks():
            received.append(chunk)
    assert b"partial" in b"".join(received)
    assert b"[DONE]" not in b"".join(received)


async def test_stream_stalling_after_the_first_chunk_raises_upstream_timeout(
    fake: FakeAnthropic,
) -> None:
    fake.script(Reply(text="slow start", stall_s=1.0))
    up = LitellmUpstream(MODEL, api_base=fake.url, api_key="k", timeout_s=0.3)
    response = await up.send(chat({**user("hi"), "stream": True}))
    assert response.status == 200
    with pytest.raises(UpstreamTimeout):
        await chunks_of(response)


# -- streaming lifetime ---------------------------------------------------------------


async def test_chunks_arrive_before_the_provider_finishes_and_close_stops_it(
    fake: FakeAnthropic, upstream: LitellmUpstream
) -> None:
    # The fake never ends this stream: the chunks can only be read unbuffered.
    fake.script(Reply(text="still going", hold_open=True))
    response = await upstream.send(chat({**user("hi"), "stream": True}))
    chunks = response.iter_chunks()
    first = sse_events([await asyncio.wait_for(anext(chunks), 2)])
    assert first[0]["choices"][0]["delta"]["content"] == "still "
    assert not fake.stream_aborted.is_set()

    await response.close()
    await response.close()  # twice is fine
    await asyncio.wait_for(fake.stream_aborted.wait(), 2)


async def test_upstream_close_stops_open_streams(fake: FakeAnthropic) -> None:
    fake.script(Reply(hold_open=True))
    up = LitellmUpstream(MODEL, api_base=fake.url, api_key="k", timeout_s=5)
    response = await up.send(chat({**user("hi"), "stream": True}))
    await up.close()
    await asyncio.wait_for(fake.stream_aborted.wait(), 2)
    assert await chunks_of(response) == []


# -- import isolation --------------------------------------------------------------------


def test_importing_the_module_does_not_import_litellm() -> None:
    code = "import proxy.upstream.provider, sys; assert 'litellm' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# -- error bodies -------------------------------------------------------------------------


@settings(max_examples=200)
@given(message=st.text(), status=st.integers(400, 599))
def test_error_body_always_has_openai_shape(message: str, status: int) -> None:
    error = orjson.loads(error_body(message, status))["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] == message
    assert isinstance(error["type"], str)


@settings(max_examples=200)
@given(message=st.text(), prefix=st.sampled_from(["litellm.BadRequestError: X - ", ""]))
def test_provider_message_is_found_inside_litellm_json_text(message: str, prefix: str) -> None:
    provider_json = orjson.dumps({"type": "error", "error": {"message": message}}).decode()
    assert provider_message(Exception(prefix + provider_json)) == message


# Characters that could themselves look like litellm's wrapping are left out.
_plain = st.text(st.characters(exclude_characters="{.-", exclude_categories=("Cs",)), min_size=1)


@settings(max_examples=200)
@given(message=_plain.filter(lambda m: m.strip() == m != ""))
def test_provider_message_strips_litellm_wrapping_of_plain_text(message: str) -> None:
    wrapped = (
        "litellm.MidStreamFallbackError: litellm.InternalServerError: AnthropicException - "
        f"{message}. Handle with `litellm.InternalServerError`."
    )
    assert provider_message(Exception(wrapped)) == message


def test_litellm_is_handed_a_copy_never_the_callers_shared_objects():
    # The pipeline's body holds the message cache's own messages: litellm changing its
    # input in place must not change what later requests of the session are served.
    message = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    parsed = {"model": "m", "messages": [message], "tools": [{"type": "function"}]}
    body = own_body(parsed, orjson.dumps(parsed))
    assert body == parsed
    assert body is not None
    body["messages"][0]["content"][0]["text"] = "changed"
    body["tools"].append({"type": "other"})
    assert message == {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    assert parsed["tools"] == [{"type": "function"}]
    # No parsed body: the bytes are parsed (each call its own objects as well).
    assert own_body(None, b'{"model": "m"}') == {"model": "m"}
    assert own_body(None, b"[1]") is None
