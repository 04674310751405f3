"""Route matching: compiled globs, the same answers as fnmatch's."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config.loader import parse_config
from proxy.errors import NotFound
from proxy.http.routing import Router

_patterns = st.sampled_from(["*", "gpt-4*", "gpt-4o", "*mini", "gpt-?o", "[gc]*", "claude-*", "x"])
_models = st.sampled_from(["gpt-4o", "gpt-4o-mini", "gpt-4", "claude-3", "cx", "x", "", "GPT-4o"])
_header_values = st.sampled_from(["support", "agents", "", "Support", "sup*"])


def config(routes: list[dict[str, Any]]) -> Any:
    return parse_config(
        {
            "store": {"path": "unused.db"},
            "upstreams": {"u": {"base_url": "http://127.0.0.1:1/v1"}},
            "routes": routes,
        }
    )


def reference(
    routes: list[dict[str, Any]], path: str, model: str, headers: dict[str, str]
) -> int | None:
    """The index of the first matching route, by fnmatchcase (what Router replaced)."""
    for i, route in enumerate(routes):
        m = route["match"]
        if not fnmatchcase(path, m.get("path", "/v1/chat/completions")):
            continue
        if "model" in m and not fnmatchcase(model, m["model"]):
            continue
        if any(
            not fnmatchcase(headers.get(n.lower(), ""), p) for n, p in m.get("headers", {}).items()
        ):
            continue
        return i
    return None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["/v1/chat/completions", "/v1/*", "/v1/responses"]),
            st.none() | _patterns,
            st.none() | _patterns,
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["/v1/chat/completions", "/v1/responses", "/v1/other"]),
    _models,
    _header_values,
)
def test_the_first_route_matching_by_fnmatch_is_chosen(specs, path, model, app):
    routes = []
    for route_path, model_glob, header_glob in specs:
        match: dict[str, Any] = {"path": route_path}
        if model_glob is not None:
            match["model"] = model_glob
        if header_glob is not None:
            match["headers"] = {"X-App": header_glob}
        routes.append({"match": match, "upstream": "u"})
    router = Router(config(routes))
    expected = reference(routes, path, model, {"x-app": app})
    if expected is None:
        with pytest.raises(NotFound):
            router.match(path, model, {"x-app": app})
    else:
        assert router.match(path, model, {"x-app": app}).name == f"routes[{expected}]"


def test_a_remembered_match_answers_as_matching_again_would():
    routes = [
        {"match": {"path": "/v1/chat/completions", "headers": {"X-App": "sup*"}}, "upstream": "u"},
        {"match": {"path": "/v1/chat/completions", "model": "gpt-4*"}, "upstream": "u"},
        {"match": {"path": "/v1/*"}, "upstream": "u"},
    ]
    router = Router(config(routes))
    cases = [
        ("/v1/chat/completions", "gpt-4o", {"x-app": "support"}),
        ("/v1/chat/completions", "gpt-4o", {"x-app": "agents", "x-other": "support"}),
        ("/v1/chat/completions", "claude-3", {}),
        ("/v1/chat/completions", None, {"x-app": ""}),
        ("/v1/responses", "gpt-4o", {"x-app": "support"}),
    ]
    for _ in range(3):  # the first pass matches, the later ones are remembered
        for path, model, headers in cases:
            expected = reference(routes, path, model or "", headers)
            if model is None and expected == 1:
                expected = 2  # a model glob never matches a request without a model
            assert router.match(path, model, headers).name == f"routes[{expected}]"
    with pytest.raises(NotFound):
        Router(config(routes[:1])).match("/v1/chat/completions", "gpt-4o", {})


def test_a_header_sent_as_raw_utf8_matches_the_routes_glob_as_text():
    routes = [
        {"match": {"headers": {"X-App": "ユーザー*"}}, "upstream": "u"},
        {"match": {"headers": {"X-App": "café"}}, "upstream": "u"},
        {"match": {}, "upstream": "u"},
    ]
    router = Router(config(routes))
    # What the ASGI server hands over: the header's bytes read as Latin-1.
    raw = "ユーザー-1".encode().decode("latin-1")
    assert router.match("/v1/chat/completions", "m", {"x-app": raw}).name == "routes[0]"
    # Bytes that are not UTF-8 stay Latin-1: 0xE9 is é.
    assert router.match("/v1/chat/completions", "m", {"x-app": "caf\xe9"}).name == "routes[1]"
