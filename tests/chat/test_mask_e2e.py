"""Observation masking through the proxy: placeholders upstream, full content stored,
the decision on the row and in headers, and the prefix kept between steps."""

from __future__ import annotations

import itertools
import json
from typing import Any

import openai

from tests.harness import query

POLICIES = {
    "agent": {
        "strategy": "none",
        "mask_tool_outputs": {"after_turns": 2, "min_tokens": 100, "step_tokens": 1500},
    }
}
ROUTES = [{"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "agent"}]


def turn(t: int) -> list[dict[str, Any]]:
    """One agent turn: a task, a tool call, its (long) result, the answer."""
    return [
        {"role": "user", "content": f"task {t}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"call_{t}",
                    "type": "function",
                    "function": {"name": "search", "arguments": json.dumps({"q": t})},
                }
            ],
        },
        {
            "role": "tool",
            "tool_call_id": f"call_{t}",
            "content": f"{t} results found\n" + f"row {t} of the answer; " * 150,
        },
        {"role": "assistant", "content": f"done {t}"},
    ]


def test_old_tool_output_is_masked_upstream_kept_in_store_and_steps_keep_the_prefix(
    fake, start_proxy, tmp_path
):
    upstream, _ = fake
    proxy = start_proxy(policies=POLICIES, routes=ROUTES)
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-mask",
        default_headers={"X-Session-Id": "agent-1"},
        max_retries=0,
    )
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    masked_counts: list[int] = []
    stable: list[int] = []
    sent_lengths: list[int] = []
    for t in range(10):
        history += turn(t)[:1]
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=history)
        masked_counts.append(int(raw.headers.get("x-context-tool-outputs-masked", "0")))
        stable.append(int(raw.headers["x-context-stable-prefix"]))
        sent_lengths.append(len(upstream.chat_requests[-1].json["messages"]))
        history += turn(t)[1:]
    # Masking grows in steps (several results at once), never shrinks.
    assert masked_counts == sorted(masked_counts) and masked_counts[-1] >= 4
    jumps = [b - a for a, b in itertools.pairwise(masked_counts) if b != a]
    assert jumps and all(j >= 2 for j in jumps)
    # Between steps, everything the previous request forwarded is the prefix.
    for i in range(1, len(stable)):
        if masked_counts[i] == masked_counts[i - 1]:
            assert stable[i] == sent_lengths[i - 1]
    last = upstream.chat_requests[-1].json["messages"]
    tool = [m for m in last if m["role"] == "tool"]
    assert tool[0]["content"].startswith("[tool output of ")
    assert tool[0]["content"].endswith("tokens omitted: 0 results found]")
    assert tool[0]["tool_call_id"] == "call_0"
    assert not tool[-1]["content"].startswith("[tool output")  # the newest results stay
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    row = query(db, "SELECT detail_json FROM requests ORDER BY created_at DESC LIMIT 1")[0]
    detail = json.loads(row["detail_json"])
    assert len(detail["masked"]) == masked_counts[-1]
    assert all(m["tokens_after"] < m["tokens_before"] for m in detail["masked"])
    # Nothing stored changed: the store holds every result in full.
    stored = [
        json.loads(r["message_json"])
        for r in query(db, "SELECT message_json FROM items WHERE role = 'tool' ORDER BY id")
    ]
    sent = history[:-3]  # the last turn's result was never sent
    assert [m["content"] for m in stored] == [m["content"] for m in sent if m["role"] == "tool"]
