"""The bench's data sets (bench/recall_data.py): LongMemEval histories become chat messages
whose evidence indices point at the turns marked ``has_answer``, split and folded by index."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.recall_data import load
from proxy.messages.view import ORIGIN, system_text


def entry(k: int, kind: str, answered: bool = True) -> dict[str, Any]:
    return {
        "question_id": f"q{k}",
        "question_type": kind,
        "question": f"What colour is bike {k}?",
        "answer": "red",
        "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 10:00"],
        "haystack_sessions": [
            [
                {"role": "user", "content": "Hello there."},
                {"role": "assistant", "content": "Hi!"},
            ],
            [
                {"role": "user", "content": f"My bike {k} is red.", "has_answer": answered},
                {"role": "assistant", "content": "Nice colour."},
            ],
        ],
    }


def test_longmemeval_evidence_points_at_the_turns_with_the_answer(tmp_path: Path) -> None:
    path = tmp_path / "lme.json"
    kinds = ["multi-session", "temporal-reasoning", "single-session-user", "knowledge-update"]
    path.write_text(json.dumps([entry(k, kind) for k, kind in enumerate(kinds)]))
    data = load(path)
    assert len(data.conversations) == 4
    for q in data.questions:
        messages = data.conversations[q.conversation]
        assert messages[0]["role"] == "system"
        assert [messages[i]["content"] for i in q.evidence] == [f"My bike {q.fold} is red."]
    assert [q.category for q in data.questions] == [1, 2, 4, 4]
    assert [q.fold for q in data.questions] == [0, 1, 2, 3]


def test_longmemeval_dev_and_test_never_share_a_question(tmp_path: Path) -> None:
    path = tmp_path / "lme.json"
    entries = [entry(k, "single-session-user") for k in range(6)]
    entries.append(entry(6, "single-session-user", answered=False))  # no evidence: left out
    path.write_text(json.dumps(entries))
    dev = {q.text for q in load(path, "dev").questions}
    test = {q.text for q in load(path, "test").questions}
    assert dev == {f"What colour is bike {k}?" for k in (0, 2, 4)}
    assert test == {f"What colour is bike {k}?" for k in (1, 3, 5)}
    assert len(load(path, "all", limit=2).questions) == 2


def test_the_anthropic_door_reads_each_history_and_question_with_the_evidence_in_place(
    tmp_path: Path,
) -> None:
    path = tmp_path / "lme.json"
    path.write_text(json.dumps([entry(k, "single-session-user") for k in range(2)]))
    chat, anthropic = load(path), load(path, door="anthropic")
    for q, a in zip(chat.questions, anthropic.questions, strict=True):
        viewed = anthropic.conversations[a.conversation]
        assert all(ORIGIN in m for m in viewed)  # the Messages door's view, not chat messages
        assert a.evidence == q.evidence
        said = [system_text(viewed[i]["content"]) for i in a.evidence]
        assert said == [f"My bike {a.fold} is red."]
        assert ORIGIN in a.message and system_text(a.message["content"]) == q.text
        assert q.message == {"role": "user", "content": q.text}
