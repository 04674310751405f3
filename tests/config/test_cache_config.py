"""An upstream's `cache:` block: both hints on by default, each switchable, errors name the key."""

from __future__ import annotations

import pytest

from proxy.config.loader import parse_config
from proxy.config.model import CacheConfig
from proxy.errors import ConfigError


def config(cache: object = None) -> dict[str, object]:
    upstream: dict[str, object] = {"base_url": "http://127.0.0.1:9/v1"}
    if cache is not None:
        upstream["cache"] = cache
    return {"upstreams": {"u": upstream}, "routes": [{"upstream": "u"}]}


def test_both_hints_are_on_by_default():
    assert parse_config(config()).upstreams["u"].cache == CacheConfig("auto", "session")


def test_each_hint_can_be_switched_off():
    parsed = parse_config(config({"breakpoints": "off", "prompt_cache_key": "off"}))
    assert parsed.upstreams["u"].cache == CacheConfig("off", "off")


@pytest.mark.parametrize(
    ("cache", "message"),
    [
        ({"breakpoints": "always"}, "upstreams.u.cache.breakpoints: must be auto or off"),
        (
            {"prompt_cache_key": "fixed"},
            "upstreams.u.cache.prompt_cache_key: must be session or off",
        ),
        ({"ttl": "5m"}, "upstreams.u.cache.ttl: unknown key"),
        ("on", "upstreams.u.cache: must be a mapping"),
    ],
)
def test_bad_values_name_the_path(cache, message):
    with pytest.raises(ConfigError) as raised:
        parse_config(config(cache))
    assert message in str(raised.value)
