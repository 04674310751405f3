"""Anthropic's compaction through /v1/messages: answered by the proxy for a translated
upstream (one ``compaction`` block from the session's summary, expanded on the next
request, recall reaching what it folded), passed through to an Anthropic upstream; the
official SDK's beta client as the client."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from proxy.context.compaction_item import PREFIX
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.upstream import FakeUpstream
from tests.harness import AiohttpServer, ProxyServer, query
from tests.messages.sdk import sdk_client

MODEL = "gpt-4o"
FACT = "The server listens on port 8731."
SUMMARIZE: Any = {"type": "summarize"}
SYSTEM = "You are a coding agent."


def history() -> list[dict[str, Any]]:
    """A conversation with a fact, a tool call and its result, and a signed thinking block."""
    return [
        {"role": "user", "content": "Set up the server."},
        {"role": "assistant", "content": FACT},
        {"role": "user", "content": "Read the config."},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "read it", "signature": "sig-1"},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "c.yaml"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "debug: true"}
            ],
        },
        {"role": "assistant", "content": "The config turns debug on."},
    ]


def threshold(trigger: int, **more: Any) -> Any:
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger}}
    return {"edits": [{**edit, **more}]}


@pytest.fixture
def translated(
    fake: tuple[FakeUpstream, AiohttpServer], start_messages: Callable[..., ProxyServer]
) -> Callable[..., ProxyServer]:
    def start(
        route: dict[str, Any] | None = None, policy: dict[str, Any] | None = None
    ) -> ProxyServer:
        return start_messages({"base_url": f"{fake[1].url}/v1"}, policy, route)

    return start


def rows(tmp_path: Path) -> list[dict[str, Any]]:
    found = query(
        tmp_path / "ctxproxy.db", "SELECT status, detail_json FROM requests ORDER BY rowid"
    )
    return [{"status": r["status"], "detail": json.loads(r["detail_json"] or "{}")} for r in found]


def compacted(sdk: anthropic.Anthropic, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The compaction block the proxy answers ``compaction: summarize`` with, as sent back
    (the conversation under a system prompt, as agents send it)."""
    answer = sdk.beta.messages.create(
        model=MODEL,
        max_tokens=100,
        system=SYSTEM,
        messages=messages,  # type: ignore[arg-type]
        compaction=SUMMARIZE,  # type: ignore[arg-type]
    )
    return answer.content[0].model_dump(exclude_none=True)


def sent_text(upstream: FakeUpstream) -> str:
    (received,) = upstream.chat_requests
    return json.dumps(received.json["messages"])


def test_summarize_is_answered_with_one_compaction_block_from_the_summarizer(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
) -> None:
    upstream, _ = fake
    proxy = translated()
    raw = sdk_client(proxy).beta.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=100,
        messages=history(),
        compaction=SUMMARIZE,  # type: ignore[arg-type]
    )
    answer = raw.parse()
    assert raw.headers["x-context-compaction"] == "created"
    assert answer.stop_reason == "compaction"
    (block,) = answer.content
    assert block.type == "compaction"
    assert block.content is not None and "fake summary 1" in block.content
    assert block.encrypted_content is not None and block.encrypted_content.startswith(PREFIX)
    assert upstream.chat_requests == []  # nothing sampled
    (summarizing,) = upstream.summarizer_requests
    assert "debug: true" in json.dumps(summarizing.json)  # the tool result was summarized
    proxy.drain()
    (row,) = rows(tmp_path)
    shown = row["detail"]["compaction"]
    assert row["status"] == 200
    assert shown["asked"] == "summarize" and shown["mode"] == "proxy"
    assert shown["status"] == "created" and shown["covered_items"] == 6


def test_a_streamed_summarize_is_anthropics_events_the_sdk_reads_into_the_block(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    proxy = translated()
    with sdk_client(proxy).beta.messages.stream(
        model=MODEL,
        max_tokens=100,
        messages=history(),
        compaction=SUMMARIZE,  # type: ignore[arg-type]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "compaction" in kinds  # the SDK's own event for a compaction delta
    assert final.stop_reason == "compaction"
    (block,) = final.content
    assert block.type == "compaction" and block.encrypted_content is not None
    assert block.encrypted_content.startswith(PREFIX)
    assert fake[0].chat_requests == []


def test_the_block_sent_back_is_expanded_into_a_summary_every_model_reads(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
) -> None:
    upstream, _ = fake
    proxy = translated()
    sdk = sdk_client(proxy)
    block = compacted(sdk, history())
    after: Any = [
        *history(),  # a client may keep them: the block stands for them
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": "What next?"},
    ]
    raw = sdk.beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, system=SYSTEM, messages=after
    )
    assert raw.headers["x-context-compaction"] == "expanded"
    sent = sent_text(upstream)
    assert "fake summary 1" in sent and "What next?" in sent
    assert "compaction" not in sent and "toolu_1" not in sent and FACT not in sent
    proxy.drain()
    shown = rows(tmp_path)[-1]["detail"]["compaction"]
    # The block stands for the system and six messages, back from the store for recall.
    assert shown["expanded"] == 1 and shown["folded"] == 6 and shown["restored"] == 7


def test_recall_reaches_a_turn_the_compaction_folded_away(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    upstream, _ = fake
    recall = {"max_tokens": 150, "neighbors": 1}
    proxy = translated(policy={"strategy": "trim", "max_tokens": 300, "recall": recall})
    sdk = sdk_client(proxy)
    # More turns after the fact: the summary saves more than a quote of it costs.
    padding: list[dict[str, Any]] = []
    for i in range(8):
        padding.append({"role": "user", "content": f"Step {i}: tidy the module number {i}."})
        padding.append({"role": "assistant", "content": f"Module {i} is tidy; nothing else."})
    block = compacted(sdk, [*history(), *padding])
    question: Any = [
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": "Which port does the server listen on?"},
    ]
    raw = sdk.beta.messages.with_raw_response.create(
        model=MODEL, max_tokens=50, system=SYSTEM, messages=question
    )
    assert int(raw.headers["x-context-recalled"]) >= 1, dict(raw.headers)
    sent = sent_text(upstream)
    # Verbatim from the proxy's stored history; the summary does not carry it.
    assert "[ctxproxy recall]" in sent and FACT in sent
    assert "8731" not in block["content"]


def test_past_the_threshold_the_answer_is_the_block_then_the_upstreams_answer(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
) -> None:
    upstream, _ = fake
    proxy = translated()
    asked: Any = [*history(), {"role": "user", "content": "Go on."}]
    answer = sdk_client(proxy).beta.messages.create(
        model=MODEL, max_tokens=50, messages=asked, context_management=threshold(10)
    )
    assert [b.type for b in answer.content] == ["compaction", "text"]
    assert answer.content[1].text == "echo: Go on."  # type: ignore[union-attr]
    (received,) = upstream.chat_requests
    messages = received.json["messages"]
    assert len(messages) == 2 and "fake summary 1" in json.dumps(messages[0])
    assert messages[1] == {"role": "user", "content": "Go on."}
    assert "context_management" not in received.json
    proxy.drain()
    shown = rows(tmp_path)[-1]["detail"]["compaction"]
    assert shown["asked"] == "threshold" and shown["threshold"] == 10
    assert shown["status"] == "created" and shown["input_tokens"] > 10


def test_past_the_threshold_streamed_the_block_comes_first_and_the_indexes_move_on(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    proxy = translated()
    asked: Any = [*history(), {"role": "user", "content": "Go on."}]
    with sdk_client(proxy).beta.messages.stream(
        model=MODEL, max_tokens=50, messages=asked, context_management=threshold(10)
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["compaction", "text"]
    assert final.content[1].text == "echo: Go on."  # type: ignore[union-attr]
    assert final.content[0].encrypted_content.startswith(PREFIX)  # type: ignore[union-attr]


def test_under_the_threshold_nothing_is_compacted_and_pause_answers_the_block_alone(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    upstream, _ = fake
    proxy = translated()
    sdk = sdk_client(proxy)
    asked: Any = [*history(), {"role": "user", "content": "Go on."}]
    under = sdk.beta.messages.create(
        model=MODEL, max_tokens=50, messages=asked, context_management=threshold(100_000)
    )
    assert [b.type for b in under.content] == ["text"]
    assert FACT in json.dumps(upstream.chat_requests[0].json["messages"])
    paused = sdk.beta.messages.create(
        model=MODEL,
        max_tokens=50,
        messages=asked,
        context_management=threshold(10, pause_after_compaction=True),
    )
    assert paused.stop_reason == "compaction" and [b.type for b in paused.content] == ["compaction"]
    assert len(upstream.chat_requests) == 1  # the pause sampled nothing


def test_compaction_off_is_a_400_in_anthropics_shape(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    proxy = translated(route={"compaction": "off"})
    sdk = sdk_client(proxy)
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk.beta.messages.create(
            model=MODEL,
            max_tokens=50,
            messages=history(),
            compaction=SUMMARIZE,  # type: ignore[arg-type]
        )
    body: Any = raised.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "compaction" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        sdk.beta.messages.create(
            model=MODEL, max_tokens=50, messages=history(), context_management=threshold(10)
        )
    assert fake[0].received == []


def test_an_anthropic_upstream_gets_the_compaction_asks_as_sent(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer]
) -> None:
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    body = {"model": "claude-fake-1", "max_tokens": 16, "messages": history()}
    for extra in ({"compaction": SUMMARIZE}, {"context_management": threshold(50_000)}):
        got = httpx.post(f"{proxy.url}/v1/messages", json={**body, **extra}, headers=headers)
        assert got.status_code == 200 and "x-context-compaction" not in got.headers
        sent = claude.requests[-1].json
        assert {k: sent[k] for k in extra} == extra
        assert sent["messages"] == history()


def test_the_proxys_own_block_is_expanded_even_for_an_anthropic_upstream(
    claude: FakeAnthropic,
    start_messages: Callable[..., ProxyServer],
    translated: Callable[..., ProxyServer],
) -> None:
    block = compacted(sdk_client(translated()), history())
    proxy = start_messages({"base_url": f"{claude.url}/v1", "api": "anthropic"})
    asked = [
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": "Go on."},
    ]
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
    body = {"model": "claude-fake-1", "max_tokens": 16, "messages": asked}
    got = httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers)
    assert got.status_code == 200
    sent = claude.requests[-1].json["messages"]
    assert "compaction" not in json.dumps(sent)  # Anthropic could not read the proxy's block
    assert "fake summary 1" in sent[0]["content"][0]["text"]


def test_a_damaged_block_is_a_400_naming_it(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    proxy = translated()
    sdk = sdk_client(proxy)
    block = compacted(sdk, history())
    block["encrypted_content"] = block["encrypted_content"][:-3] + "xyz"
    asked: Any = [
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": "Go on."},
    ]
    with pytest.raises(anthropic.BadRequestError) as raised:
        sdk.beta.messages.create(model=MODEL, max_tokens=50, messages=asked)
    body: Any = raised.value.body
    assert body["type"] == "error" and "messages.0.content.0" in body["error"]["message"]
    assert fake[0].chat_requests == []


def test_the_streamed_events_validate_as_the_sdks_beta_stream_events(
    translated: Callable[..., ProxyServer],
) -> None:
    from anthropic.types.beta import BetaRawMessageStreamEvent
    from pydantic import TypeAdapter

    proxy = translated()
    asked: Any = [*history(), {"role": "user", "content": "Go on."}]
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "x-session-id": "s-raw"}
    adapter: Any = TypeAdapter(BetaRawMessageStreamEvent)
    for extra in ({"compaction": SUMMARIZE}, {"context_management": threshold(10)}):
        body = {"model": MODEL, "max_tokens": 50, "messages": asked, "stream": True, **extra}
        got = httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers, timeout=30)
        assert got.status_code == 200
        events = [
            json.loads(line[6:])
            for event in got.content.split(b"\n\n")
            for line in event.split(b"\n")
            if line.startswith(b"data: ")
        ]
        for event in events:
            adapter.validate_python(event)
        kinds = [e["type"] for e in events]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        starts = [e for e in events if e["type"] == "content_block_start"]
        assert starts[0]["index"] == 0 and starts[0]["content_block"]["type"] == "compaction"
        assert [s["index"] for s in starts] == list(range(len(starts)))


def test_a_second_compaction_extends_the_first_summary_with_only_the_newer_turns(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer], tmp_path: Path
) -> None:
    upstream, _ = fake
    proxy = translated()
    sdk = sdk_client(proxy)
    first = compacted(sdk, history())
    later = [
        {"role": "assistant", "content": [first]},
        {"role": "user", "content": "Rename the module to beta."},
        {"role": "assistant", "content": "Renamed it to beta."},
    ]
    second = compacted(sdk, later)
    assert "fake summary 2" in second["content"]
    extending = json.dumps(upstream.summarizer_requests[-1].json)
    assert "fake summary 1" in extending and "Renamed it to beta." in extending
    assert "debug: true" not in extending  # the folded turns are not summarized again
    proxy.drain()
    shown = rows(tmp_path)[-1]["detail"]["compaction"]
    assert shown["status"] == "created" and shown["incremental"] is True


def test_the_preview_and_count_tokens_read_the_block_expanded_and_compact_nothing(
    translated: Callable[..., ProxyServer], fake: tuple[FakeUpstream, AiohttpServer]
) -> None:
    upstream, _ = fake
    proxy = translated()
    sdk = sdk_client(proxy)
    block = compacted(sdk, history())
    made = len(upstream.summarizer_requests)
    asked = [
        *history(),
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": "Go on."},
    ]
    headers = {"x-api-key": "k", "anthropic-version": "2023-06-01", "x-session-id": "s-msg"}
    body = {"model": MODEL, "max_tokens": 50, "messages": asked}
    shown = httpx.post(f"{proxy.url}/v1/context/preview", json=body, headers=headers)
    assert shown.status_code == 200, shown.text
    forwarded = shown.json()["messages"]
    assert "fake summary 1" in json.dumps(forwarded[0]) and forwarded[-1]["content"] == "Go on."
    assert "compaction" not in json.dumps(forwarded) and FACT not in json.dumps(forwarded)
    past = {**body, "context_management": threshold(10)}
    counted = sdk.beta.messages.count_tokens(model=MODEL, messages=asked)  # type: ignore[arg-type]
    whole = sdk.beta.messages.count_tokens(model=MODEL, messages=history())  # type: ignore[arg-type]
    assert 0 < counted.input_tokens < whole.input_tokens  # the summary, not the history
    past_count = httpx.post(f"{proxy.url}/v1/messages/count_tokens", json=past, headers=headers)
    assert past_count.json()["input_tokens"] == counted.input_tokens  # counted as sent
    assert len(upstream.summarizer_requests) == made  # neither made a summary
    assert upstream.chat_requests == []


def test_compaction_proxy_over_an_anthropic_upstream_answers_it_and_forwards_no_ask(
    claude: FakeAnthropic, start_messages: Callable[..., ProxyServer], tmp_path: Path
) -> None:
    proxy = start_messages(
        {"base_url": f"{claude.url}/v1", "api": "anthropic"}, route={"compaction": "proxy"}
    )
    asked: Any = [*history(), {"role": "user", "content": "Go on."}]
    with sdk_client(proxy).beta.messages.stream(
        model="claude-fake-1", max_tokens=16, messages=asked, context_management=threshold(10)
    ) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["compaction", "text"]
    block = final.content[0]
    assert block.encrypted_content.startswith(PREFIX)  # type: ignore[union-attr]
    sent = claude.requests[-1].json
    assert "context_management" not in sent and "compaction" not in json.dumps(sent)
    assert sent["messages"][-1]["content"] == "Go on." and len(sent["messages"]) == 2
    proxy.drain()
    shown = rows(tmp_path)[-1]["detail"]["compaction"]
    assert shown["mode"] == "proxy" and shown["status"] == "created"
