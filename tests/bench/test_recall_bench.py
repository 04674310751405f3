"""bench/recall.py's folds end to end on a tiny synthetic conversation set (not LoCoMo): the
conversations stored in SQLite, every grid setting run through the proxy's recall step, each
fold's choice printed beside the in-sample figure."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from bench import recall
from bench.recall_data import load
from proxy.store.sqlite import SqliteStore
from tests.fakes.embedder import FakeEmbedder


def conversation(k: int) -> dict[str, Any]:
    """Two speakers, 40 filler turns around one turn that answers the question."""
    turns = [
        {"speaker": "Ann" if i % 2 == 0 else "Bob", "dia_id": f"D1:{i}", "text": f"chat {i} " * 60}
        for i in range(40)
    ]
    turns[5]["text"] = f"My cat number {k} is called Biscuit."
    return {
        "sample_id": f"syn-{k}",
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bob", "session_1": turns},
        "qa": [
            {
                "question": "What is the cat called?",
                "answer": "Biscuit",
                "evidence": ["D1:5"],
                "category": 4,
            }
        ],
    }


def test_folds_run_the_grid_and_print_each_held_out_conversation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "syn.json"
    path.write_text(json.dumps([conversation(k) for k in range(2)]))
    data = load(path)

    async def run() -> None:
        store = SqliteStore(tmp_path / "bench.db")
        await store.open()
        try:
            await recall.store_all(store, data.conversations)
            await recall.tune(
                store, data.conversations, data.questions, True, data.folds, FakeEmbedder()
            )
        finally:
            await store.close()

    asyncio.run(run())
    out = capsys.readouterr().out
    assert "leave one conversation out: recall at 25% of the tokens (21 settings)" in out
    held = [line for line in out.splitlines() if line.startswith("syn-")]
    assert len(held) == 4  # two conversations at each of two budgets
    # The answering turn is a lexical hit: every fold keeps it.
    assert all("100.0%" in line for line in held)
