"""`python -m proxy replay`: a conversation through a configured policy, offline, turn by turn."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import yaml

from proxy.context.rewriter import Rewriter
from proxy.ops import cli
from proxy.ops.replay import TurnResult, conversations_from, format_row, format_totals, replay
from tests.shared_data import shared_file


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


REPLAY_POLICIES = {
    "last1": {"strategy": "trim", "max_turns": 1},
    "fit": {"strategy": "trim", "max_tokens": 1500, "tool_output_max_tokens": 200},
}


def write_config(tmp_path: Path, policies: dict[str, Any] = REPLAY_POLICIES) -> Path:
    path = tmp_path / "replay.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "store": {"path": str(tmp_path / "unused.db")},
                # Nothing listens there: a call that left the process would fail.
                "upstreams": {"d": {"base_url": "http://127.0.0.1:9/v1"}},
                "routes": [{"upstream": "d", "policy": next(iter(policies))}],
                "policies": policies,
            }
        )
    )
    return path


CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "one"},
    {"role": "assistant", "content": "1"},
    {"role": "user", "content": "two"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "three"},
]


def test_replay_prints_one_row_per_turn(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT))
    code, out, err = run(
        "replay", str(chat), "--config", str(write_config(tmp_path)), "--policy", "last1"
    )
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "# chat (1/1): 6 messages, policy last1, model gpt-4o"
    assert lines[1].split()[:3] == ["turn", "msgs", "sent"]
    rows = [line.split() for line in lines[2:5]]
    # turn, messages before, sent, ..., turns dropped, clipped, summary, prefix, stable, reason
    assert [(r[0], r[1], r[2]) for r in rows] == [("1", "2", "2"), ("2", "4", "2"), ("3", "6", "2")]
    assert [r[6] for r in rows] == ["0", "1", "2"]
    assert [r[9:] for r in rows] == [
        ["-", "-"],
        ["1/2", "yes", "max_turns"],
        ["1/2", "yes", "max_turns"],
    ]
    assert lines[5].startswith("3 turns, 0 refused; tokens sent")


def test_replay_jsonl_matches_the_rewriters_decisions(tmp_path):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT))
    config = write_config(tmp_path)
    code, out, _ = run("replay", str(chat), "--config", str(config), "--policy", "last1", "--jsonl")
    assert code == 0
    rows = [orjson.loads(line) for line in out.splitlines()]
    from proxy.config.loader import load_config

    rewriter = Rewriter(load_config(config).policies)
    expected = list(replay(CHAT, lambda m: rewriter.decide("last1", m, {}, "gpt-4o")))
    assert rows == [{"conversation": "chat", **r.as_dict()} for r in expected]
    assert [r["tokens_after"] < r["tokens_before"] for r in rows] == [False, True, True]


def test_replay_of_a_tau_conversation_clips_and_trims(tmp_path):
    tau = shared_file("tau-airline-dev.json")
    code, out, _ = run(
        "replay",
        str(tau),
        "--config",
        str(write_config(tmp_path)),
        "--policy",
        "fit",
        "--index",
        "3",
    )
    assert code == 0
    task = json.loads(tau.read_text())[3]
    assert out.startswith(f"# task {task['task_id']} (1/1): {len(task['traj'])} messages")
    users = sum(1 for m in task["traj"] if m["role"] == "user")
    assert f"{users} turns, 0 refused" in out


FOLD = {
    "strategy": "summarize",
    "trigger": {"turns": 2},
    "keep_last_turns": 1,
    "summarizer": {"model": "ctxproxy/extractive"},
}


def write_summarize_config(tmp_path: Path, **over: Any) -> Path:
    return write_config(tmp_path, {"fold": {**FOLD, **over}})


def support_chat(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"Order #{4410 + t} is late. Turn {t}."})
        messages.append({"role": "assistant", "content": f"Checking order #{4410 + t}."})
    return messages


def test_replay_runs_a_summarize_policy_offline_with_summaries_in_memory(tmp_path):
    chat = tmp_path / "support.json"
    chat.write_text(json.dumps(support_chat(5)))
    # The policy names a model on an upstream nobody serves: offline, the extractive
    # stand-in writes the summaries instead.
    config = write_summarize_config(tmp_path, summarizer={"model": "gpt-4o-mini"})
    code, out, err = run("replay", str(chat), "--config", str(config), "--policy", "fold")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0].endswith("policy fold, model gpt-4o, summarizer ctxproxy/extractive (offline)")
    assert lines[1].split()[-2:] == ["outcome", "reason"]
    rows = [line.split() for line in lines[2:7]]
    # Turns 1-2 are within the trigger. After turn 2's answer the summary the third
    # request needs is made ahead; it serves turn 4 too (two verbatim turns), and
    # after turn 4's answer a longer one is made for turn 5.
    assert [r[11] for r in rows] == ["none", "none", "reused", "reused", "reused"]
    assert [r[6] for r in rows] == ["0", "0", "2", "2", "4"]  # turns summarized
    sizes = [int(r[8]) for r in rows]  # the summary's tokens, per turn
    assert sizes[:2] == [0, 0] and 0 < sizes[2] == sizes[3] < sizes[4]
    assert all(r[12] == "summarized" for r in rows[2:])
    assert lines[7].endswith("; summary 0 created, 3 reused, 0 fallback")
    assert lines[8] == (
        "summarizer calls: 2 (0 a request waited for, 2 made ahead after an answer), 0 failed"
    )


def test_replay_of_a_summarize_policy_without_prefetch_makes_summaries_on_demand(tmp_path):
    chat = tmp_path / "support.json"
    chat.write_text(json.dumps(support_chat(5)))
    config = write_summarize_config(tmp_path, prefetch=False)
    code, out, _ = run("replay", str(chat), "--config", str(config), "--policy", "fold", "--jsonl")
    assert code == 0
    rows = [orjson.loads(line) for line in out.splitlines()]
    # The third and fifth requests pass the trigger and wait for a new summary.
    assert [r["summary"] for r in rows] == ["none", "none", "created", "reused", "created"]
    assert [r["fallback"] for r in rows] == [None] * 5
    assert [r["summary_tokens"] > 0 for r in rows] == [False, False, True, True, True]
    # The system message, the summary, the turns kept and the new question.
    assert [r["messages_after"] for r in rows[2:]] == [3, 5, 3]


def test_replay_of_a_summarize_policy_forwards_what_the_proxy_forwarded(start_proxy, tmp_path):
    proxy = start_proxy(
        policies={"fold": FOLD},
        routes=[
            {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fold"}
        ],
    )
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-r",
        max_retries=0,
        default_headers={"X-Session-Id": "same"},
    )
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a support agent."}]
    seen = []
    for t in range(5):
        messages.append({"role": "user", "content": f"Order #{4410 + t} is late. Turn {t}."})
        raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=messages)
        h = raw.headers
        seen.append(
            (
                h["x-context-summary"],
                int(h["x-context-tokens-after"]),
                h.get("x-context-trim-reason"),
            )
        )
        messages.append({"role": "assistant", "content": raw.parse().choices[0].message.content})
        proxy.drain()  # the summary made ahead after the answer is stored before the next turn
    chat = tmp_path / "same.json"
    chat.write_text(json.dumps(messages))
    config = write_summarize_config(tmp_path)
    code, out, _ = run("replay", str(chat), "--config", str(config), "--policy", "fold", "--jsonl")
    assert code == 0
    replayed = [
        (r["summary"], r["tokens_after"], r["reason"]) for r in map(orjson.loads, out.splitlines())
    ]
    assert replayed == seen
    assert [s for s, _, _ in seen] == ["none", "none", "reused", "reused", "reused"]


def test_a_replayed_fallback_says_why_in_the_row_and_the_totals():
    row = TurnResult(3, 6, 4, 90, 60, 2, 2, 0, "max_turns", 0, 1, 4, False, summary="fallback")
    failed = replace(row, fallback="summarizer_empty")
    assert format_row(failed).endswith(" no fallback  max_turns (summarizer_empty)")
    assert format_totals([failed]).endswith("; summary 0 created, 0 reused, 1 fallback")
    assert "summary" not in format_totals([replace(row, summary=None)])


def test_long_replays_show_progress_on_stderr(tmp_path):
    locomo = shared_file("locomo-dev.json")
    config = str(write_config(tmp_path))
    code, out, err = run(
        "replay", str(locomo), "--config", config, "--policy", "fit", "--index", "0"
    )
    assert code == 0
    conversation = conversations_from(json.loads(locomo.read_text()))[0]
    turns = sum(1 for m in conversation.messages if m["role"] == "user")
    assert err.splitlines()[-2] == f"replaying: {turns}/{turns} turns (100%)"
    assert err.splitlines()[-1].startswith(f"replayed {turns} turns in ")
    assert out.count("\n") == turns + 4  # title, header, one row per turn, totals, blank
    assert (
        run(
            "replay",
            str(locomo),
            "--config",
            config,
            "--policy",
            "fit",
            "--index",
            "0",
            "--no-progress",
        )[2]
        == ""
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "nope"], "no policy 'nope'"),
        (["--policy", "last1", "--index", "5"], "--index must be 0..0"),
    ],
)
def test_replay_refuses_bad_arguments(tmp_path, args, message):
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT))
    code, _, err = run("replay", str(chat), "--config", str(write_config(tmp_path)), *args)
    assert code == 2 and message in err


def test_replay_refuses_a_file_it_cannot_read(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"not": "a message"}]))
    code, _, err = run(
        "replay", str(bad), "--config", str(write_config(tmp_path)), "--policy", "last1"
    )
    assert code == 2 and "cannot replay" in err
