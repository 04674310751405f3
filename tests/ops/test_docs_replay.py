"""The replay guide's examples on the shipped sample run from a plain clone, as printed."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "tests" / "data" / "support-chat.json"
GUIDE = REPO / "docs" / "guides" / "replay.md"


def guide_commands() -> list[str]:
    text = GUIDE.read_text()
    return re.findall(r"^\$ (python -m proxy replay tests/data/\S+.*)$", text, re.M)


def test_the_sample_is_a_chat_conversation_with_tool_calls():
    messages = json.loads(SAMPLE.read_text())
    assert messages[0]["role"] == "system"
    assert sum(m["role"] == "user" for m in messages) == 23
    calls = {c["id"] for m in messages for c in m.get("tool_calls") or []}
    results = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert calls and calls == results


def test_the_guide_s_replay_examples_run_on_the_sample_as_printed():
    commands = guide_commands()
    assert len(commands) >= 4, "the replay guide shows no replay of tests/data/"
    text = GUIDE.read_text()
    for command in commands:
        args = shlex.split(command)[3:]  # after `python -m proxy`
        out = subprocess.run(
            [sys.executable, "-m", "proxy", *args], capture_output=True, text=True, cwd=REPO
        )
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        # The header, the column names and the totals are pasted in the guide as printed.
        for line in (lines[0], lines[1], lines[-2], lines[-1]):
            assert line in text, line
