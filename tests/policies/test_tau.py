"""Every trimming rule on every tau-bench airline conversation, request by request.

Each conversation is replayed as its client sent it: one request at each user
message holding everything up to it, and the whole conversation once more.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from policies.trim import budget_limit
from policies.types import Budget, TrimSpec
from proxy.context.tokens import counter_for
from tests.policies.test_properties import run_and_check, simple_count
from tests.shared_data import shared_file

SPECS = [
    TrimSpec(max_turns=3),
    TrimSpec(max_tokens=2500),
    TrimSpec(max_tokens=2500, low_water=0.7),
    TrimSpec(max_tokens=2500, tool_output_max_tokens=300),
    TrimSpec(max_turns=4, context_fraction=0.4, low_water=0.7, tool_output_max_tokens=150),
]
WINDOW = 8000  # for context_fraction: 0.4 of it, minus the reserve, is 2900


@pytest.fixture(scope="module")
def conversations() -> list[list[dict[str, Any]]]:
    data = json.loads(shared_file("tau-airline-dev.json").read_text())
    return [entry["traj"] for entry in data]


def requests(conversation: list[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    for i, message in enumerate(conversation):
        if message["role"] == "user":
            yield conversation[: i + 1]
    yield conversation


def replay(conversations: list[list[dict[str, Any]]], spec: TrimSpec, count: Any) -> dict[str, int]:
    seen = {"requests": 0, "trimmed": 0, "clipped": 0, "repaired": 0, "too_long": 0}
    budget = Budget(limit=budget_limit(spec, WINDOW, 300), fixed=3)
    for conversation in conversations:
        for request in requests(conversation):
            d = run_and_check(request, spec, count, budget)
            seen["requests"] += 1
            if d is None:
                seen["too_long"] += 1
                continue
            seen["trimmed"] += bool(d.turns_dropped)
            seen["clipped"] += bool(d.clipped)
            seen["repaired"] += bool(d.repaired)
    return seen


@pytest.mark.parametrize("spec", SPECS, ids=repr)
def test_every_tau_request_obeys_the_rules(
    conversations: list[list[dict[str, Any]]], spec: TrimSpec
) -> None:
    seen = replay(conversations, spec, simple_count)
    assert seen["requests"] == 786  # 686 user messages + 100 whole conversations
    assert seen["trimmed"] > 100  # the limits bind: this is not a vacuous pass
    if spec.tool_output_max_tokens is not None:
        assert seen["clipped"] > 0


def test_tau_conversations_with_a_lost_tool_result_are_repaired(
    conversations: list[list[dict[str, Any]]],
) -> None:
    broken = []
    for conversation in conversations:
        tools = [i for i, m in enumerate(conversation) if m["role"] == "tool"]
        if tools:
            broken.append(conversation[: tools[0]] + conversation[tools[0] + 1 :])
    seen = replay(broken, TrimSpec(max_tokens=2500, low_water=0.7), simple_count)
    assert seen["repaired"] > len(broken)  # every later request of each one


@pytest.mark.parametrize("spec", [SPECS[2], SPECS[4]], ids=repr)
def test_every_tau_request_obeys_the_rules_with_the_real_tokenizer(
    conversations: list[list[dict[str, Any]]], spec: TrimSpec
) -> None:
    seen = replay(conversations, spec, counter_for("gpt-4o").count_message)
    assert seen["trimmed"] > 100
