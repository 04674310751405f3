"""A route's ``compaction`` and ``compaction_summarizer``: parsed once, errors name path and value."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config.loader import parse_config
from proxy.config.model import COMPACTION_SUMMARIZER
from proxy.errors import ConfigError


def config(**route: Any) -> Any:
    return parse_config(
        {
            "upstreams": {"up": {"base_url": "http://127.0.0.1:9/v1"}},
            "routes": [{"match": {"path": "/v1/responses"}, "upstream": "up", **route}],
        }
    )


def test_compaction_defaults_to_auto_with_the_compaction_summarizer():
    route = config().routes[0]
    assert route.compaction == "auto"
    assert route.compaction_summarizer == COMPACTION_SUMMARIZER


@pytest.mark.parametrize("mode", ["auto", "proxy", "upstream", "off"])
def test_each_compaction_mode_is_read(mode: str):
    assert config(compaction=mode).routes[0].compaction == mode


def test_an_unknown_compaction_mode_names_its_path_and_value():
    with pytest.raises(ConfigError) as caught:
        config(compaction="sometimes")
    assert caught.value.path == "routes[0].compaction"
    assert "'sometimes'" in caught.value.message


def test_the_compaction_summarizer_is_read_as_a_policy_summarizer():
    route = config(compaction_summarizer={"model": "small", "max_tokens": 300}).routes[0]
    assert route.compaction_summarizer.model == "small"
    assert route.compaction_summarizer.max_tokens == 300
    assert route.compaction_summarizer.timeout_s == COMPACTION_SUMMARIZER.timeout_s


def test_a_compaction_summarizer_naming_no_upstream_is_an_error():
    with pytest.raises(ConfigError) as caught:
        config(compaction_summarizer={"upstream": "nowhere"})
    assert caught.value.path == "routes[0].compaction_summarizer.upstream"
    assert "'nowhere'" in caught.value.message
