"""The ``recall:`` block of a policy: parsed once, every error naming its path."""

from __future__ import annotations

from typing import Any

import pytest

from policies.types import SEMANTIC_WEIGHT, RecallSpec, SummarizeSpec, TrimSpec
from proxy.config.loader import parse_config
from proxy.errors import ConfigError


def config(policy: dict[str, Any]) -> Any:
    return parse_config(
        {
            "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
            "routes": [{"match": {"path": "/v1/chat/completions"}, "upstream": "u", "policy": "p"}],
            "policies": {"p": policy},
        }
    )


def test_a_trim_policy_takes_a_recall_block():
    spec = config(
        {
            "strategy": "trim",
            "max_tokens": 6000,
            "recall": {"max_tokens": 2500, "neighbors": 3, "embeddings": "none", "expand": True},
        }
    ).policies["p"]
    assert isinstance(spec, TrimSpec)
    assert spec.recall == RecallSpec(max_tokens=2500, neighbors=3, expand=True)


def test_a_summarize_policy_takes_a_share_and_an_empty_block_defaults_to_a_share():
    spec = config({"strategy": "summarize", "max_tokens": 4000, "recall": {"share": 0.4}}).policies[
        "p"
    ]
    assert isinstance(spec, SummarizeSpec) and spec.recall == RecallSpec(share=0.4)
    spec = config({"strategy": "trim", "max_tokens": 4000, "recall": {}}).policies["p"]
    assert isinstance(spec, TrimSpec) and spec.recall == RecallSpec(share=0.3)


def test_embeddings_wordllama_turns_on_semantic_recall_with_the_measured_weight_or_a_given_one():
    spec = config(
        {"strategy": "trim", "max_tokens": 4000, "recall": {"embeddings": "wordllama"}}
    ).policies["p"]
    assert isinstance(spec, TrimSpec) and spec.recall is not None
    assert spec.recall.embeddings == "wordllama"
    assert spec.recall.semantic_weight == SEMANTIC_WEIGHT
    recall = {"embeddings": "wordllama", "semantic_weight": 0}
    spec = config({"strategy": "trim", "max_tokens": 4000, "recall": recall}).policies["p"]
    assert isinstance(spec, TrimSpec) and spec.recall is not None
    assert spec.recall.semantic_weight == 0.0


def test_no_recall_block_means_no_recall():
    spec = config({"strategy": "trim", "max_tokens": 4000}).policies["p"]
    assert isinstance(spec, TrimSpec) and spec.recall is None


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        (
            {"strategy": "trim", "max_tokens": 10, "recall": {"share": 1.5}},
            "policies.p.recall.share: must be > 0.0 and <= 0.9, got 1.5",
        ),
        (
            {"strategy": "trim", "max_turns": 3, "recall": {"share": 0.3}},
            "policies.p.recall.share: needs a token budget",
        ),
        (
            {"strategy": "trim", "max_turns": 3, "recall": {}},
            "policies.p.recall: needs max_tokens",
        ),
        (
            {"strategy": "trim", "max_tokens": 99, "recall": {"max_tokens": 20, "share": 0.2}},
            "policies.p.recall.share: give max_tokens or share, not both",
        ),
        (
            {"strategy": "trim", "max_tokens": 99, "recall": {"embeddings": "bert"}},
            "policies.p.recall.embeddings: must be one of none, wordllama; got 'bert'",
        ),
        (
            {
                "strategy": "trim",
                "max_tokens": 99,
                "recall": {"embeddings": "wordllama", "semantic_weight": 1.5},
            },
            "policies.p.recall.semantic_weight: must be >= 0 and <= 1, got 1.5",
        ),
        (
            {"strategy": "trim", "max_tokens": 99, "recall": {"semantic_weight": 0.5}},
            "policies.p.recall.semantic_weight: needs embeddings: wordllama",
        ),
        (
            {"strategy": "trim", "max_tokens": 99, "recall": {"neighbours": 1}},
            "policies.p.recall.neighbours: unknown key",
        ),
        (
            {"strategy": "trim", "max_tokens": 99, "recall": {"neighbors": 9}},
            "policies.p.recall.neighbors: must be <= 5, got 9",
        ),
        (
            {"strategy": "trim", "max_tokens": 99, "recall": {"expand": "yes"}},
            "policies.p.recall.expand: must be true or false, got 'yes'",
        ),
        (
            {"strategy": "none", "recall": {"max_tokens": 100}},
            "policies.p.recall: unknown key",
        ),
    ],
)
def test_bad_recall_blocks_name_the_path_and_the_value(policy: dict[str, Any], message: str):
    with pytest.raises(ConfigError) as err:
        config(policy)
    assert message in str(err.value)
