"""Recall on every tau-bench airline conversation, request by request: 0 invalid sequences.

Every message the policy dropped is a hit (the worst case for placement and
pairing: as much comes back as fits), with scores in an arbitrary order.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies.recall import Hit, recall
from policies.trim import trim
from policies.types import Budget, ContextTooLong, TrimSpec
from policies.units import find_orphans
from tests.policies.test_properties import simple_count
from tests.policies.test_tau import requests
from tests.shared_data import shared_file


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, Any]]]:
    data = json.loads(shared_file("tau-airline-dev.json").read_text())
    return [entry["traj"] for entry in data]


@pytest.mark.parametrize("neighbors", [0, 1])
def test_no_forwarded_list_has_an_unpaired_tool_call_or_result(
    conversations: list[list[dict[str, Any]]], neighbors: int
) -> None:
    recalled = 0
    for conversation in conversations:
        for messages in requests(conversation):
            try:
                decision = trim(messages, TrimSpec(max_tokens=1800), simple_count, Budget(1800))
            except ContextTooLong:
                continue  # the newest turn alone is over the budget: a 400, nothing to recall
            hits = [Hit(i, float((i * 7919) % 97)) for i in decision.dropped]
            out, got = recall(messages, decision, hits, simple_count, 700, neighbors=neighbors)
            assert find_orphans(out.messages) == ()
            assert got.tokens <= 700 and out.tokens_after <= 2500
            if got.position is not None:
                newest = max(i for i, m in enumerate(messages) if m["role"] == "user")
                assert out.messages[got.position + 1] is messages[newest]
                recalled += 1
    assert recalled > 0
