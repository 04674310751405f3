"""The long conversations bench/recall.py measures on, with their questions and evidence turns.

Two formats, told apart by their fields:

- LoCoMo (``conversation``/``qa``; ../shared/data/locomo-dev.json, CC BY-NC 4.0,
  never copied into the project): a few very long two-person conversations,
  many questions each, evidence as turn ids (``D3:13``). A fold is a
  conversation.
- LongMemEval (``haystack_sessions``; Wu et al., ICLR 2025, MIT licence;
  ``longmemeval_s_cleaned.json`` from huggingface.co/datasets/xiaowu0162/longmemeval-cleaned,
  see docs/benchmarks/recall.md): one user-assistant history of some 40 sessions per
  question, its evidence turns marked ``has_answer``. A question's history is its own
  conversation; questions are dealt into four folds by their index, and ``split`` keeps
  the even (``dev``) or odd (``test``) ones, so the test half is never tuned on.

Each history becomes chat messages after a system message. Session dates are
not put into the messages: a client talking through the proxy does not send them.
Each conversation and question then goes through ``door`` (bench/door.py): with
``anthropic``, as the Messages door's view reads it from an Anthropic request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.door import through
from proxy.ops.replay import locomo_dialogue

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
# LongMemEval's question types on the same four rows (abstention questions have no evidence).
LONGMEMEVAL = {
    "multi-session": 1,
    "temporal-reasoning": 2,
    "single-session-preference": 3,
    "single-session-user": 4,
    "single-session-assistant": 4,
    "knowledge-update": 4,
}
FOLDS = 4


@dataclass
class Question:
    conversation: int
    text: str
    category: int
    evidence: list[int]
    # The leave-one-out group: the conversation (LoCoMo) or the index mod 4 (LongMemEval).
    fold: int
    # The question as the newest user message, as its door reads it.
    message: dict[str, Any]


@dataclass(frozen=True)
class DataSet:
    name: str
    conversations: list[list[dict[str, Any]]]
    questions: list[Question]
    folds: list[str]  # a name per fold


def load(path: Path, split: str = "all", limit: int | None = None, door: str = "openai") -> DataSet:
    """The data set at ``path`` (LoCoMo or LongMemEval, by its fields) through ``door``."""
    entries = json.loads(path.read_text())
    if entries and "haystack_sessions" in entries[0]:
        return longmemeval(entries, split, limit, door)
    return locomo(entries, door)


def viewed(door: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A conversation as the policies get it through ``door``."""
    out = through(door, messages)
    # The evidence turns' positions hold: the door reads a dialogue one message a message.
    assert len(out) == len(messages), (len(out), len(messages))
    return out


def asked(door: str, text: str) -> dict[str, Any]:
    """A question as the newest user message, through ``door``."""
    (question,) = through(door, [{"role": "user", "content": text}])
    return question


def locomo(entries: list[dict[str, Any]], door: str = "openai") -> DataSet:
    conversations: list[list[dict[str, Any]]] = []
    questions: list[Question] = []
    for k, entry in enumerate(entries):
        messages, turns = locomo_dialogue(entry)
        conversations.append(viewed(door, messages))
        for q in entry["qa"]:
            category = q.get("category")
            evidence = [turns[e] for e in q.get("evidence", []) if e in turns]
            if category in CATEGORIES and evidence and "answer" in q:
                text = str(q["question"])
                questions.append(Question(k, text, int(category), evidence, k, asked(door, text)))
    names = [str(e.get("sample_id", k)) for k, e in enumerate(entries)]
    return DataSet("LoCoMo", conversations, questions, names)


def longmemeval(
    entries: list[dict[str, Any]], split: str, limit: int | None, door: str = "openai"
) -> DataSet:
    keep = {"all": (0, 1), "dev": (0,), "test": (1,)}[split]
    conversations: list[list[dict[str, Any]]] = []
    questions: list[Question] = []
    for index, entry in enumerate(entries):
        category = LONGMEMEVAL.get(str(entry.get("question_type")))
        if index % 2 not in keep or category is None:
            continue
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a helpful assistant."}
        ]
        evidence: list[int] = []
        for session in entry["haystack_sessions"]:
            for turn in session:
                if turn.get("role") not in ("user", "assistant"):
                    continue
                if turn.get("has_answer"):
                    evidence.append(len(messages))
                messages.append({"role": turn["role"], "content": str(turn["content"])})
        if not evidence:
            continue
        k = len(conversations)
        conversations.append(viewed(door, messages))
        text = str(entry["question"])
        questions.append(Question(k, text, category, evidence, index % FOLDS, asked(door, text)))
        if limit is not None and len(conversations) >= limit:
            break
    names = [f"q mod 4 = {f}" for f in range(FOLDS)]
    return DataSet(f"LongMemEval {split}", conversations, questions, names)
