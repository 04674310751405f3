"""The example config, as a newcomer meets it: the README's first snippet, then a long chat.

The catch-all route serves ``balanced``: once the conversation passes ten
turns the older ones are summarized (by the request's own model) and fewer
tokens are forwarded, and ``X-Context-Mode-Rule`` says whether a rule chose
the mode. An order number does not switch it to ``full`` (the summary pins it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import yaml

from proxy.config.loader import parse_config
from proxy.context.model_info import context_window

REPO = Path(__file__).resolve().parents[2]


def example(upstream_url: str, tmp_path: Path) -> Any:
    # The example's `fit` policy reads context windows: litellm's model map is loaded at
    # start-up. Load it here, so a busy machine doesn't spend the harness's start timeout on it.
    context_window("gpt-4o")
    data = yaml.safe_load((REPO / "config.example.yaml").read_text())
    data["upstreams"]["openai"]["base_url"] = f"{upstream_url}/v1"
    data["store"]["path"] = str(tmp_path / "ctxproxy.db")
    return parse_config(data)


def readme_client(proxy: Any, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-newcomer",
        max_retries=0,
        default_headers={"X-Session-Id": "conversation-42", **headers},
    )


def long_chat(turns: int, last: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"Question {t} about my order 4412: what about step {t}?"},
            {"role": "assistant", "content": f"For step {t}, check the settings page. " * 8},
        ]
    return [*messages, {"role": "user", "content": last}]


def test_the_readme_snippet_is_context_managed_by_the_example(fake, start_proxy, tmp_path):
    upstream, server = fake
    proxy = start_proxy(config=example(server.url, tmp_path))
    client = readme_client(proxy)
    first = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
    )
    assert first.headers["x-context-policy"] == "balanced"
    assert first.headers["x-context-mode"] == "balanced"
    assert first.headers["x-context-mode-rule"] == "none"
    # A long conversation that keeps naming an order number: still balanced, and it saves
    # (the policy's part; balanced's recall brings back summarized turns naming the order).
    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=long_chat(14, "And where is order #4412 now?")
    )
    assert raw.headers["x-context-mode"] == "balanced"
    assert raw.headers["x-context-mode-rule"] == "none"
    assert raw.headers["x-context-summary"] == "created"
    before = int(raw.headers["x-context-tokens-before"])
    after = int(raw.headers["x-context-tokens-after"])
    recalled = int(raw.headers["x-context-recall-tokens"])
    assert raw.headers["x-context-recall"] == "recalled"
    assert after - recalled < before * 0.9, (before, after, recalled)
    assert after <= before
    forwarded = upstream.chat_requests[-1].json["messages"]
    assert len(forwarded) < len(long_chat(14, "x"))
    assert "4412" in forwarded[0]["content"]  # the summary's pinned facts keep the order number


@pytest.mark.parametrize(
    ("headers", "last", "mode", "rule"),
    [
        ({}, "Can you recap everything we discussed?", "full", "recap"),
        ({"X-Context-Mode": "concise"}, "Can you recap?", "concise", "header"),
        ({}, "Thanks!", "balanced", "none"),
    ],
)
def test_x_context_mode_rule_names_what_chose_the_mode(
    fake, start_proxy, tmp_path, headers, last, mode, rule
):
    _, server = fake
    proxy = start_proxy(config=example(server.url, tmp_path))
    raw = readme_client(proxy, **headers).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=long_chat(2, last)
    )
    assert (raw.headers["x-context-mode"], raw.headers["x-context-mode-rule"]) == (mode, rule)


def test_an_unnamed_rule_is_named_by_its_index(fake, start_proxy):
    rules = {
        "rules": [{"match": "never", "mode": "concise"}, {"match": "(?i)urgent", "mode": "full"}]
    }
    proxy = start_proxy(
        routes=[
            {
                "match": {"path": "/v1/chat/completions"},
                "upstream": "default",
                "policy": "balanced",
                "modes": rules,
            }
        ]
    )
    raw = readme_client(proxy).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "URGENT: help"}]
    )
    assert raw.headers["x-context-mode-rule"] == "rules[1]"


def test_a_route_without_modes_sends_no_rule_header(fake, start_proxy):
    proxy = start_proxy()
    raw = readme_client(proxy).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
    )
    assert "x-context-mode-rule" not in raw.headers
