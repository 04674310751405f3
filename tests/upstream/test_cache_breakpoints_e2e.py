"""Anthropic prompt caching through litellm: breakpoints where the policy's stable prefix
ends, and the cache figures Anthropic reports (read and written) on the request row.

The fake Anthropic simulates its explicit cache (only prefixes ending at a
``cache_control`` breakpoint are written and read; tests/fakes/prefix_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.config.loader import parse_config
from tests.fakes.anthropic import FakeAnthropic
from tests.fakes.prefix_cache import AnthropicPrefixCache
from tests.harness import LoopThread, ProxyServer, query

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SYSTEM = "You are a careful assistant. " + " ".join(
    f"Guideline {i}: answer with the facts of the conversation only." for i in range(110)
)


@pytest.fixture
def anthropic(loop_thread: LoopThread) -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic(prefix_cache=AnthropicPrefixCache())
    loop_thread.run(fake.start())
    yield fake
    loop_thread.run(fake.stop())


@pytest.fixture
def start(
    loop_thread: LoopThread, anthropic: FakeAnthropic, tmp_path: Path
) -> Iterator[Callable[..., ProxyServer]]:
    servers: list[ProxyServer] = []

    def run(cache: dict[str, Any] | None = None, policy: str = "passthrough") -> ProxyServer:
        upstream: dict[str, Any] = {
            "litellm_model": "anthropic/claude-sonnet-4-5",
            "api_base": anthropic.url,
            "timeout_s": 10,
        }
        if cache is not None:
            upstream["cache"] = cache
        config = parse_config(
            {
                "store": {"path": str(tmp_path / "p.db")},
                "upstreams": {"claude": upstream},
                "routes": [
                    {
                        "match": {"path": "/v1/chat/completions"},
                        "upstream": "claude",
                        "policy": policy,
                    }
                ],
                "policies": {"last2": {"strategy": "trim", "max_turns": 2}},
            }
        )
        server = ProxyServer(loop_thread, config)
        servers.append(server)
        return server

    yield run
    for server in servers:
        server.stop()


def client(proxy: ProxyServer, session: str = "claude-1") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-ant-client",
        max_retries=0,
        default_headers={"X-Session-Id": session},
    )


def marks(body: dict[str, Any]) -> list[tuple[str, str]]:
    """Where the Anthropic request carries breakpoints: (role, text or block type)."""
    out: list[tuple[str, str]] = []
    for block in body.get("system") or []:
        if block.get("cache_control"):
            out.append(("system", block["text"][:20]))
    for message in body["messages"]:
        content = message["content"]
        for block in content if isinstance(content, list) else []:
            if block.get("cache_control"):
                out.append((message["role"], str(block.get("text") or block["type"])[:20]))
    return out


def test_breakpoints_mark_the_system_block_the_last_kept_turn_and_the_newest_message(
    start, anthropic, tmp_path
):
    proxy = start()
    c = client(proxy)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    answers = []
    for t in range(3):
        messages.append({"role": "user", "content": f"question {t}"})
        answers.append(c.chat.completions.create(model="claude-sonnet-4-5", messages=messages))
        messages.append({"role": "assistant", "content": f"answer {t}"})
    last = anthropic.requests[-1].json
    assert marks(last) == [
        ("system", SYSTEM[:20]),
        ("assistant", "answer 1"),  # the stable prefix's end: the turn before the newest
        ("user", "question 2"),  # the newest message, read by the next request
    ]
    proxy.drain()
    got = query(tmp_path / "p.db", "SELECT * FROM requests ORDER BY created_at")
    # The first request wrote the cache; the next ones read what the previous one wrote.
    assert got[0]["cached_tokens"] == 0 and got[0]["cache_write_tokens"] > 1024
    assert all(r["cached_tokens"] > 1024 for r in got[1:])
    for row, answer in zip(got, answers, strict=True):
        usage = answer.usage
        assert row["cached_tokens"] == usage.prompt_tokens_details.cached_tokens
        assert row["upstream_prompt_tokens"] == usage.prompt_tokens
    assert '"breakpoints"' in got[-1]["detail_json"]


def test_breakpoints_follow_the_trim_policy_stable_prefix(start, anthropic):
    proxy = start(policy="last2")
    c = client(proxy, "trimmed")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for t in range(4):
        messages.append({"role": "user", "content": f"question {t}"})
        c.chat.completions.create(model="claude-sonnet-4-5", messages=messages)
        messages.append({"role": "assistant", "content": f"answer {t}"})
    body = anthropic.requests[-1].json
    # Two turns kept: the breakpoint before the newest is the kept turn's answer.
    assert [m["content"][0].get("text") for m in body["messages"]] == [
        "question 2",
        "answer 2",
        "question 3",
    ]
    assert marks(body) == [
        ("system", SYSTEM[:20]),
        ("assistant", "answer 2"),
        ("user", "question 3"),
    ]


def test_a_clients_own_breakpoints_are_left_alone_and_count_toward_the_limit(start, anthropic):
    proxy = start()
    c = client(proxy, "own")
    mine = {"type": "ephemeral"}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM, "cache_control": mine}]},
        {"role": "user", "content": [{"type": "text", "text": "q0", "cache_control": mine}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a0", "cache_control": mine}]},
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]
    c.chat.completions.create(model="claude-sonnet-4-5", messages=messages)
    body = anthropic.requests[-1].json
    # Three of the client's, one of ours (the stable prefix's end): four in all.
    assert marks(body) == [
        ("system", SYSTEM[:20]),
        ("user", "q0"),
        ("assistant", "a0"),
        ("assistant", "a1"),
    ]


def test_breakpoints_off_sends_none(start, anthropic):
    proxy = start(cache={"breakpoints": "off"})
    client(proxy).chat.completions.create(
        model="claude-sonnet-4-5",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}],
    )
    assert marks(anthropic.requests[-1].json) == []


def test_streamed_anthropic_cache_figures_reach_the_row(start, anthropic, tmp_path):
    proxy = start()
    c = client(proxy, "streamed")
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for t in range(2):
        messages.append({"role": "user", "content": f"question {t}"})
        stream = c.chat.completions.create(
            model="claude-sonnet-4-5",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        usage = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
        messages.append({"role": "assistant", "content": f"answer {t}"})
    proxy.drain()
    got = query(tmp_path / "p.db", "SELECT * FROM requests ORDER BY created_at")
    assert got[-1]["cached_tokens"] == usage.prompt_tokens_details.cached_tokens > 1024
