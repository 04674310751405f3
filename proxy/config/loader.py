"""Configuration: YAML parsed once into frozen, typed objects.

Every problem is reported with the path of the bad key and the bad value
(``policies.fit.low_water: must be > 0 and <= 1, got 1.5``). This is the only
module that reads the environment (``os.environ/NAME`` references).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from policies.types import NoneSpec, PolicySpec, TrimSpec
from proxy.config.masking import mask_spec
from proxy.config.model import (
    ENV_PREFIX,
    AdminConfig,
    CacheConfig,
    Config,
    LoggingConfig,
    RouteConfig,
    RouteMatch,
    ServerConfig,
    SessionConfig,
    UpstreamConfig,
)
from proxy.config.node import ANY, Node, duration, show
from proxy.config.recall import recall_spec
from proxy.config.shared import (
    COORDINATION_KEYS,
    check_coordination,
    coordination_config,
    store_config,
)
from proxy.config.summarize import (
    BUILTIN_MODES,
    check_route_policy,
    route_modes,
    summarize_policy,
)
from proxy.errors import ConfigError


def _server(node: Node) -> ServerConfig:
    d = ServerConfig()
    return ServerConfig(
        host=node.text("host", d.host) or d.host,
        port=node.integer("port", d.port, minimum=1) or d.port,
        max_body_bytes=node.integer("max_body_bytes", d.max_body_bytes, minimum=1024)
        or d.max_body_bytes,
    )


def _session(node: Node) -> SessionConfig:
    fallbacks = node.raw("fallbacks") or []
    if not isinstance(fallbacks, list) or not all(isinstance(f, str) for f in fallbacks):
        raise ConfigError(node.at("fallbacks"), f"must be a list of strings, got {show(fallbacks)}")
    for i, f in enumerate(fallbacks):
        if f not in ("body.user", "body.metadata.session_id") and not f.startswith("header:"):
            raise ConfigError(
                f"{node.at('fallbacks')}[{i}]",
                f"must be body.user, body.metadata.session_id or header:NAME, got {f!r}",
            )
    return SessionConfig(
        header=node.text("header", "X-Session-Id") or "X-Session-Id",
        fallbacks=tuple(fallbacks),
        ttl_s=duration(node, "ttl"),
    )


def _admin(node: Node) -> AdminConfig:
    raw = node.raw("api_key")
    if raw is None:
        return AdminConfig()
    if not isinstance(raw, str) or not raw.startswith(ENV_PREFIX):
        # The admin key reads and deletes every tenant's history: keep it out of the file.
        raise ConfigError(
            node.at("api_key"), "must be an os.environ/NAME reference, not the key itself"
        )
    return AdminConfig(api_key=node.text("api_key", env=True))


def _upstream(name: str, node: Node) -> UpstreamConfig:
    base_url = node.text("base_url")
    model = node.text("litellm_model")
    if (base_url is None) == (model is None):
        raise ConfigError(node.path, "needs exactly one of base_url or litellm_model")
    if base_url is not None and not base_url.startswith(("http://", "https://")):
        raise ConfigError(node.at("base_url"), f"must be an http(s) URL, got {base_url!r}")
    responses = node.text("responses", "bridge" if model else "native")
    if responses not in ("native", "bridge"):
        raise ConfigError(node.at("responses"), f"must be native or bridge, got {responses!r}")
    if model is not None and responses == "native":
        raise ConfigError(
            node.at("responses"),
            "must be bridge for a litellm_model upstream (it has no /responses)",
        )
    return UpstreamConfig(
        name=name,
        base_url=base_url.rstrip("/") if base_url else None,
        litellm_model=model,
        api_base=node.text("api_base"),
        api_key=node.text("api_key", env=True),
        timeout_s=node.number("timeout_s", 600.0) or 600.0,
        connect_timeout_s=node.number("connect_timeout_s", 10.0) or 10.0,
        headers=node.str_map("headers"),
        responses="bridge" if responses == "bridge" else "native",
        cache=_cache(node.child("cache", {"breakpoints", "prompt_cache_key"})),
    )


def _cache(node: Node) -> CacheConfig:
    breakpoints = node.text("breakpoints", "auto")
    if breakpoints not in ("auto", "off"):
        raise ConfigError(node.at("breakpoints"), f"must be auto or off, got {breakpoints!r}")
    key = node.text("prompt_cache_key", "session")
    if key not in ("session", "off"):
        raise ConfigError(node.at("prompt_cache_key"), f"must be session or off, got {key!r}")
    return CacheConfig(
        breakpoints="off" if breakpoints == "off" else "auto",
        prompt_cache_key="off" if key == "off" else "session",
    )


def _policy(name: str, node: Node, base_dir: Path, upstreams: Mapping[str, Any]) -> PolicySpec:
    strategy = node.text("strategy")
    if strategy == "summarize":
        return summarize_policy(node, base_dir, upstreams)
    if strategy in (None, "none"):
        node = Node(node.path, node.value, {"strategy", "mask_tool_outputs"})
        return NoneSpec(mask_tool_outputs=mask_spec(node))
    if strategy == "trim":
        node = Node(
            node.path,
            node.value,
            {
                "strategy",
                "max_turns",
                "max_tokens",
                "context_fraction",
                "low_water",
                "tool_output_max_tokens",
                "recall",
                "mask_tool_outputs",
            },
        )
        spec = TrimSpec(
            max_turns=node.integer("max_turns", minimum=1),
            max_tokens=node.integer("max_tokens", minimum=1),
            context_fraction=node.number("context_fraction", high=1.0),
            low_water=node.number("low_water", high=1.0),
            tool_output_max_tokens=node.integer("tool_output_max_tokens", minimum=16),
            mask_tool_outputs=mask_spec(node),
        )
        budgeted = spec.max_tokens is not None or spec.context_fraction is not None
        spec = dataclasses.replace(spec, recall=recall_spec(node, has_budget=budgeted))
        if spec.max_turns is None and spec.max_tokens is None and spec.context_fraction is None:
            raise ConfigError(
                node.path, "a trim policy needs max_turns, max_tokens or context_fraction"
            )
        return spec
    raise ConfigError(
        node.at("strategy"), f"must be one of none, trim, summarize; got {strategy!r}"
    )


def _route(
    index: int, node: Node, config_upstreams: Mapping[str, Any], pols: Mapping[str, Any]
) -> RouteConfig:
    match = node.child("match", {"path", "model", "headers"})
    upstream = node.required_str("upstream")
    if upstream not in config_upstreams:
        raise ConfigError(node.at("upstream"), f"names no configured upstream: {upstream!r}")
    policy = node.text("policy", "passthrough") or "passthrough"
    if policy not in pols:
        raise ConfigError(node.at("policy"), f"names no configured policy: {policy!r}")
    history = node.text("history", "client")
    if history not in ("client", "server"):
        raise ConfigError(node.at("history"), f"must be client or server, got {history!r}")
    path = match.text("path", "/v1/chat/completions") or "/v1/chat/completions"
    check_route_policy(node, path, pols[policy])
    return RouteConfig(
        name=node.text("name") or f"routes[{index}]",
        match=RouteMatch(path=path, model=match.text("model"), headers=match.str_map("headers")),
        upstream=upstream,
        policy=policy,
        history="server" if history == "server" else "client",
        modes=route_modes(node),
    )


def parse_config(data: Any, source: str | None = None) -> Config:
    root = Node(
        "",
        data,
        {
            "server",
            "session",
            "store",
            "coordination",
            "upstreams",
            "routes",
            "policies",
            "logging",
            "admin",
        },
    )
    ups = root.raw("upstreams")
    if not isinstance(ups, Mapping) or not ups:
        raise ConfigError("upstreams", "must be a non-empty mapping of name to upstream")
    upstreams = {
        str(name): _upstream(
            str(name),
            Node(
                f"upstreams.{name}",
                body,
                {
                    "base_url",
                    "litellm_model",
                    "api_base",
                    "api_key",
                    "timeout_s",
                    "connect_timeout_s",
                    "headers",
                    "responses",
                    "cache",
                },
            ),
        )
        for name, body in ups.items()
    }
    raw_policies = root.raw("policies") or {}
    if not isinstance(raw_policies, Mapping):
        raise ConfigError("policies", f"must be a mapping, got {show(raw_policies)}")
    # Built in: passthrough and the three context modes (the file may redefine a mode).
    policies: dict[str, PolicySpec] = {"passthrough": NoneSpec(), **BUILTIN_MODES}
    # A summarizer's prompt_file is relative to the config file.
    base_dir = Path(source).parent if source else Path.cwd()
    for name, body in raw_policies.items():
        node = Node(f"policies.{name}", body, ANY)
        policies[str(name)] = _policy(str(name), node, base_dir, upstreams)
    raw_routes = root.raw("routes")
    if not isinstance(raw_routes, list) or not raw_routes:
        raise ConfigError("routes", "must be a non-empty list")
    routes = tuple(
        _route(
            i,
            Node(f"routes[{i}]", r, {"name", "match", "upstream", "policy", "history", "modes"}),
            upstreams,
            policies,
        )
        for i, r in enumerate(raw_routes)
    )
    log = root.child("logging", {"level", "format"})
    level = (log.text("level", "info") or "info").lower()
    if level not in ("debug", "info", "warning", "error"):
        raise ConfigError("logging.level", f"must be debug, info, warning or error, got {level!r}")
    fmt = log.text("format", "auto") or "auto"
    if fmt not in ("auto", "json", "console"):
        raise ConfigError("logging.format", f"must be auto, json or console, got {fmt!r}")
    store = store_config(root.child("store", {"path", "url", "pool_size", "schema", "key_prefix"}))
    coordination = coordination_config(root.child("coordination", COORDINATION_KEYS))
    check_coordination(store, coordination)
    return Config(
        upstreams=upstreams,
        routes=routes,
        policies=policies,
        server=_server(root.child("server", {"host", "port", "max_body_bytes"})),
        session=_session(root.child("session", {"header", "fallbacks", "ttl"})),
        store=store,
        coordination=coordination,
        logging=LoggingConfig(level=level, format=fmt),  # type: ignore[arg-type]
        admin=_admin(root.child("admin", {"api_key"})),
        source=source,
    )


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {str(p)!r}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{p}: invalid YAML: {exc}") from exc
    return parse_config(data, source=str(p))
