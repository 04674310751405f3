"""Config of summarization: summarize policies, the built-in modes, a route's modes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.modes import BALANCED, CONCISE, FULL
from policies.types import SummarizerSpec, SummarizeSpec
from proxy.config.loader import load_config, parse_config
from proxy.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def base(policy: dict[str, Any] | None = None, **route: Any) -> dict[str, Any]:
    return {
        "upstreams": {"default": {"base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"upstream": "default", "policy": "support", **route}],
        "policies": {"support": {"strategy": "summarize", **(policy or {"trigger": {"turns": 8}})}},
    }


def test_the_issue_example_parses_to_a_summarize_spec(tmp_path):
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "support.md").write_text("Summarize tersely.")
    (tmp_path / "config.yaml").write_text(
        """
upstreams:
  default: {base_url: "http://127.0.0.1:9/v1"}
routes:
  - {upstream: default, policy: support}
policies:
  support:
    strategy: summarize
    trigger: {turns: 8}
    keep_last_turns: 3
    summarizer:
      model: gpt-4o-mini
      upstream: default
      max_tokens: 400
      prompt_file: prompts/support.md
      timeout_s: 20
    placement: system
"""
    )
    spec = load_config(tmp_path / "config.yaml").policies["support"]
    assert spec == SummarizeSpec(
        trigger_turns=8,
        keep_last_turns=3,
        summarizer=SummarizerSpec(
            model="gpt-4o-mini",
            upstream="default",
            max_tokens=400,
            prompt="Summarize tersely.",
            prompt_file="prompts/support.md",
            timeout_s=20.0,
        ),
    )


def test_the_three_modes_are_always_there_and_a_file_may_replace_one():
    config = parse_config(base())
    assert config.policies["concise"] == CONCISE
    assert config.policies["balanced"] == BALANCED
    assert config.policies["full"] == FULL
    data = base()
    data["policies"]["concise"] = {"strategy": "trim", "max_turns": 2}
    assert parse_config(data).policies["concise"].strategy == "trim"


def test_the_example_config_documents_a_summarize_policy_and_route_modes():
    config = load_config(REPO / "config.example.yaml")
    spec = config.policies["summarized"]
    assert isinstance(spec, SummarizeSpec)
    assert (spec.trigger_turns, spec.trigger_tokens, spec.keep_last_turns) == (8, 6000, 3)
    (default,) = [r for r in config.routes if r.name == "default"]
    assert default.policy == "balanced"
    assert default.modes is not None and default.modes.header
    (recap,) = default.modes.rules
    assert (recap.name, recap.mode) == ("recap", "full")
    assert recap.pattern.search("Can you recap everything we discussed?")
    # An order number alone keeps the conversation balanced: summaries pin identifiers.
    assert not recap.pattern.search("where is order #1234?")


def test_route_modes_parse_header_and_rules():
    rules = [{"match": r"(?i)order\s*#?\d+", "mode": "full"}]
    route = parse_config(base(modes={"header": True, "rules": rules})).routes[0]
    assert route.modes is not None
    assert route.modes.header is True
    assert route.modes.rules[0].pattern.search("ORDER #12")
    assert parse_config(base()).routes[0].modes is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            base({"trigger": {"turns": 8}, "keep_last_turns": 9}),
            "policies.support.keep_last_turns: must be <= trigger.turns (8), got 9",
        ),
        (
            base({"trigger": {"turns": 4}, "keep_first_turns": 2}),
            "policies.support.keep_first_turns: plus keep_last_turns must be <= trigger.turns (4), got 2 + 3",
        ),
        (base({"keep_last_turns": 3}), "policies.support.trigger: needs turns or tokens"),
        (base({"trigger": {"turn": 8}}), "policies.support.trigger.turn: unknown key"),
        (base({"trigger": {"turns": 0}}), "policies.support.trigger.turns: must be >= 1, got 0"),
        (
            base({"trigger": {"tokens": "6000"}}),
            "policies.support.trigger.tokens: must be an integer, got '6000'",
        ),
        (
            base({"trigger": {"turns": 8}, "placement": "top"}),
            "policies.support.placement: must be system or pair, got 'top'",
        ),
        (
            base({"trigger": {"turns": 8}, "summary_share": 0.1}),
            "policies.support.summary_share: needs a token budget",
        ),
        (
            base({"trigger": {"turns": 8}, "low_water": 2}),
            "policies.support.low_water: must be > 0.0 and <= 1.0, got 2",
        ),
        (
            base({"trigger": {"turns": 8}, "prefetch": "yes"}),
            "policies.support.prefetch: must be true or false, got 'yes'",
        ),
        (
            base({"trigger": {"turns": 8}, "keep_last": 3}),
            "policies.support.keep_last: unknown key",
        ),
        (
            base({"trigger": {"turns": 8}, "summarizer": {"upstream": "nope"}}),
            "policies.support.summarizer.upstream: names no configured upstream: 'nope'",
        ),
        (
            base({"trigger": {"turns": 8}, "summarizer": {"max_tokens": 5}}),
            "policies.support.summarizer.max_tokens: must be >= 16, got 5",
        ),
        (
            base({"trigger": {"turns": 8}, "summarizer": {"timeout_s": 0}}),
            "policies.support.summarizer.timeout_s: must be > 0.0, got 0",
        ),
        (
            base({"trigger": {"turns": 8}, "summarizer": {"prompt_file": "/nonexistent/p.md"}}),
            "policies.support.summarizer.prompt_file: cannot read '/nonexistent/p.md'",
        ),
        (
            base({"trigger": {"turns": 8}, "summarizer": {"modle": "x"}}),
            "policies.support.summarizer.modle: unknown key",
        ),
        (base(modes={"header": "yes"}), "routes[0].modes.header: must be true or false, got 'yes'"),
        (
            base(modes={"rules": [{"match": "(", "mode": "full"}]}),
            "routes[0].modes.rules[0].match: is not a valid regular expression",
        ),
        (
            base(modes={"rules": [{"match": "x", "mode": "verbose"}]}),
            "routes[0].modes.rules[0].mode: must be one of concise, balanced, full, got 'verbose'",
        ),
        (base(modes={"rules": [{"mode": "full"}]}), "routes[0].modes.rules[0].match: is required"),
        (base(modes={"rules": "full"}), "routes[0].modes.rules: must be a list"),
        (base(modes={"headers": True}), "routes[0].modes.headers: unknown key"),
        (
            base(match={"path": "/v1/*"}),
            "routes[0].policy: a summarize policy serves /v1/chat/completions only",
        ),
    ],
)
def test_every_bad_key_is_named_with_its_value(data, message):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert message in str(info.value)


def test_an_empty_prompt_file_is_an_error(tmp_path):
    (tmp_path / "empty.md").write_text("  \n")
    data = base({"trigger": {"turns": 8}, "summarizer": {"prompt_file": "empty.md"}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"summarizer\.prompt_file: .* is empty"):
        load_config(tmp_path / "c.yaml")
