"""Context modes through the proxy: the built-in policies, the header, and rules."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from policies.transcript import SUMMARY_HEADER
from tests.harness import query

RULES = {
    "header": True,
    "rules": [{"match": r"(?i)order\s*#?\d+|E\d{3,}", "mode": "full"}],
}


def route(policy: str = "balanced", modes: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    r: dict[str, Any] = {"match": {"path": "/v1/chat/completions"}, "upstream": "default"}
    r["policy"] = policy
    if modes is not None:
        r["modes"] = modes
    return [r]


def client(proxy: Any, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-t",
        max_retries=0,
        default_headers={"X-Session-Id": "m-1", **headers},
    )


def chat(turns: int, last: str = "What now?") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be helpful."}]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"question {t}"},
            {"role": "assistant", "content": f"answer {t}"},
        ]
    return [*messages, {"role": "user", "content": last}]


def ask(c: openai.OpenAI, messages: list[dict[str, Any]]) -> Any:
    return c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)


def test_balanced_is_a_built_in_policy_and_names_its_mode(fake, start_proxy, tmp_path):
    proxy = start_proxy(routes=route("balanced"))
    raw = ask(client(proxy), chat(3))
    assert raw.headers["x-context-mode"] == "balanced"
    assert raw.headers["x-context-policy"] == "balanced"
    assert raw.headers["x-context-summary"] == "none"
    proxy.drain()
    (row,) = query(tmp_path / "ctxproxy.db", "SELECT mode, policy FROM requests")
    assert (row["mode"], row["policy"]) == ("balanced", "balanced")


def test_concise_keeps_three_turns_once_past_five(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(routes=route("concise"))
    messages = chat(6)
    raw = ask(client(proxy), messages)
    assert raw.headers["x-context-summary"] == "created"
    forwarded = upstream.chat_requests[-1].json["messages"]
    assert forwarded[1]["content"].startswith(SUMMARY_HEADER)
    assert forwarded[2:] == messages[-5:]  # two whole turns and the new question
    # At most 10% of the 2500-token budget for the summary's answer.
    assert upstream.summarizer_requests[0].json["max_tokens"] <= 250


def test_the_header_picks_a_mode_when_the_route_allows_it(fake, start_proxy, tmp_path):
    upstream, _ = fake
    proxy = start_proxy(routes=route("balanced", {"header": True}))
    messages = chat(6)
    raw = ask(client(proxy, **{"X-Context-Mode": "concise"}), messages)
    assert raw.headers["x-context-mode"] == "concise"
    assert raw.headers["x-context-policy"] == "concise"
    assert raw.headers["x-context-summary"] == "created"
    # The mode header is ours: it never reaches the upstream.
    assert all(k.lower() != "x-context-mode" for k in upstream.chat_requests[-1].headers)
    proxy.drain()
    (row,) = query(tmp_path / "ctxproxy.db", "SELECT mode, detail_json FROM requests")
    assert row["mode"] == "concise"
    assert json.loads(row["detail_json"])["summary"]["status"] == "created"


def test_the_header_is_ignored_when_the_route_does_not_allow_it(fake, start_proxy):
    proxy = start_proxy(routes=route("balanced"))
    raw = ask(client(proxy, **{"X-Context-Mode": "concise"}), chat(6))
    assert raw.headers["x-context-mode"] == "balanced"
    assert raw.headers["x-context-summary"] == "none"


def test_an_unknown_mode_is_a_400_naming_the_choices(fake, start_proxy):
    upstream, _ = fake
    proxy = start_proxy(routes=route("balanced", {"header": True}))
    with pytest.raises(openai.BadRequestError) as info:
        ask(client(proxy, **{"X-Context-Mode": "verbose"}), chat(1))
    error = info.value.response.json()["error"]
    assert error["code"] == "invalid_value"
    assert "concise, balanced, full" in error["message"]
    assert upstream.received == []


@pytest.mark.parametrize(
    ("last", "mode"),
    [
        ("Where is my order #4412?", "full"),
        ("The app says E5021 again", "full"),
        ("Thanks, that helps", "concise"),
    ],
)
def test_a_rule_on_the_latest_user_message_switches_the_mode(fake, start_proxy, last, mode):
    upstream, _ = fake
    proxy = start_proxy(routes=route("concise", RULES))
    raw = ask(client(proxy), chat(6, last))
    assert raw.headers["x-context-mode"] == mode
    # full keeps everything under its budget; concise summarizes past five turns.
    summarized = upstream.summarizer_requests != []
    assert summarized == (mode == "concise")


def test_the_header_wins_over_the_rules(fake, start_proxy):
    proxy = start_proxy(routes=route("concise", RULES))
    raw = ask(client(proxy, **{"X-Context-Mode": "balanced"}), chat(2, "order #1"))
    assert raw.headers["x-context-mode"] == "balanced"


def test_a_route_policy_that_is_no_mode_sends_no_mode_header(fake, start_proxy):
    proxy = start_proxy(
        policies={"last3": {"strategy": "trim", "max_turns": 3}}, routes=route("last3")
    )
    raw = ask(client(proxy), chat(2))
    assert "x-context-mode" not in raw.headers
    assert "x-context-summary" not in raw.headers
    assert raw.headers["x-context-policy"] == "last3"
