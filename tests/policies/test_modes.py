"""policies/modes.py: the three presets and how a request's mode is chosen."""

from __future__ import annotations

import re
from typing import Any

from policies.modes import BALANCED, CONCISE, FULL, ModeRule, latest_user_text, select
from policies.summarize import allowance, assemble, plan
from policies.types import Budget
from tests.policies.test_properties import simple_count as count

RULES = (
    ModeRule(re.compile(r"(?i)order\s*#?\d+"), "full"),
    ModeRule(re.compile(r"E\d{3,}"), "concise"),
)


def chat(turns: int, words: int = 5, last: str = "go on") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "sys"}]
    for t in range(turns):
        out += [
            {"role": "user", "content": f"q{t} " + "word " * words},
            {"role": "assistant", "content": f"a{t} " + "word " * words},
        ]
    return [*out, {"role": "user", "content": last}]


def test_the_header_beats_the_rules_which_beat_the_route():
    messages = chat(1, last="my order #12")
    assert select("balanced", messages, requested="concise", rules=RULES).by == "header"
    choice = select("balanced", messages, rules=RULES)
    assert (choice.policy, choice.mode, choice.by) == ("full", "full", "rule")
    choice = select("balanced", chat(1), rules=RULES)
    assert (choice.policy, choice.mode, choice.by) == ("balanced", "balanced", "route")


def test_the_first_matching_rule_wins():
    assert select("balanced", chat(1, last="order 5 failed with E500"), rules=RULES).mode == "full"


def test_rules_read_only_the_latest_user_message():
    messages = chat(1, last="thanks")
    messages[1] = {"role": "user", "content": "order #99"}
    assert select("balanced", messages, rules=RULES).by == "route"


def test_a_route_policy_that_is_no_mode_has_no_mode():
    choice = select("last3", chat(1))
    assert (choice.policy, choice.mode) == ("last3", None)


def test_latest_user_text_reads_text_parts():
    parts = [{"type": "text", "text": "order #7"}, {"type": "image_url", "image_url": {}}]
    messages = [{"role": "user", "content": parts}, {"role": "assistant", "content": "ok"}]
    assert "order #7" in latest_user_text(messages)
    assert latest_user_text([{"role": "system", "content": "x"}]) == ""


def kept_turns(messages: list[dict[str, Any]], spec: Any) -> tuple[int, bool]:
    """Verbatim user turns forwarded, and whether a summary was made."""
    planned = plan(messages, spec, count, Budget())
    if planned.task is None:
        assert planned.decision is not None
        return sum(m["role"] == "user" for m in planned.decision.messages), False
    d = assemble(messages, spec, count, Budget(), planned.task.state("summary"))
    return sum(m["role"] == "user" for m in d.messages), True


def test_concise_keeps_three_to_five_turns():
    assert kept_turns(chat(4), CONCISE) == (5, False)
    assert kept_turns(chat(5), CONCISE) == (3, True)


def test_balanced_keeps_eight_to_ten_turns():
    assert kept_turns(chat(9), BALANCED) == (10, False)
    assert kept_turns(chat(10), BALANCED) == (8, True)


def test_full_keeps_everything_until_its_budget_then_summarizes_the_middle():
    assert kept_turns(chat(60), FULL) == (61, False)
    long = chat(150, words=40)
    assert sum(map(count, long)) > 12000
    planned = plan(long, FULL, count, Budget())
    assert planned.task is not None and planned.task.start_unit == 1
    d = assemble(long, FULL, count, Budget(), planned.task.state("middle"))
    assert d.messages[1:3] == long[1:3]  # the opening turn stays verbatim
    assert d.tokens_after <= 12000


def test_each_mode_bounds_its_summary_by_its_share_of_the_budget():
    for spec, share in ((CONCISE, 0.10), (BALANCED, 0.5), (FULL, 0.15)):
        assert spec.max_tokens is not None
        total, answer, facts = allowance(spec, spec.max_tokens)
        assert total <= share * spec.max_tokens
        assert answer + facts <= total
    assert (CONCISE.max_tokens, BALANCED.max_tokens) == (2500, 5000)
    assert FULL.max_tokens is not None and FULL.max_tokens >= 8000


def test_every_mode_recalls_a_measured_share_of_its_budget():
    # bench/recall.py's modes section chose them (docs/benchmarks/recall.md): a user who
    # only names a mode gets recall.
    for mode in (CONCISE, BALANCED, FULL):
        assert mode.recall is not None and mode.recall.share is not None
        assert 0 < mode.recall.share < 0.5
