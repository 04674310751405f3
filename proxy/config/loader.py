"""Configuration: YAML parsed once into frozen, typed objects.

Every problem is reported with the path of the bad key and the bad value
(``policies.fit.low_water: must be > 0 and <= 1, got 1.5``), all of a file's
problems at once (see proxy/config/node.py: the getters record and go on).
Every string value may be an ``os.environ/NAME`` reference, resolved before
parsing; every relative path is taken from the config file's folder; a key
written twice in one mapping is an error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml

from policies.types import NoneSpec, PolicySpec, TrimSpec
from proxy.config.client_keys import parse_client_keys
from proxy.config.duplicates import duplicate_keys
from proxy.config.masking import mask_spec
from proxy.config.model import (
    ENV_PREFIX,
    AdminConfig,
    AgentSessions,
    CacheConfig,
    Config,
    LoggingConfig,
    MemoryConfig,
    RouteConfig,
    RouteMatch,
    ServerConfig,
    SessionConfig,
    StoreConfig,
    UpstreamConfig,
)
from proxy.config.node import (
    ANY,
    EnvStr,
    Node,
    collecting,
    duration,
    report,
    resolve_env,
    section,
    show,
)
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
    route_compaction,
    route_modes,
    summarize_policy,
)
from proxy.errors import ConfigError, ConfigErrors

STORE_KEYS = {"path", "url", "pool_size", "schema", "key_prefix"}

SESSION_KEYS = {"header", "fallbacks", "agents", "ttl", "anonymous_tenant"}
AGENT_KEYS = {"codex", "claude_code", "prompt_cache_key"}
SERVER_KEYS = {
    "host",
    "port",
    "max_body_bytes",
    "client_keys",
    "header_timeout_s",
    "body_timeout_s",
    "keep_alive_s",
    "max_connections",
}


def _server(node: Node, base_dir: Path) -> ServerConfig:
    d = ServerConfig()
    return ServerConfig(
        host=node.text("host", d.host) or d.host,
        port=node.integer("port", d.port, minimum=1, maximum=65535) or d.port,
        max_body_bytes=node.integer("max_body_bytes", d.max_body_bytes, minimum=1024)
        or d.max_body_bytes,
        client_keys=parse_client_keys(node.at("client_keys"), node.raw("client_keys"), base_dir),
        header_timeout_s=node.number("header_timeout_s", d.header_timeout_s) or 0.0,
        body_timeout_s=node.number("body_timeout_s", d.body_timeout_s) or 0.0,
        keep_alive_s=node.number("keep_alive_s", d.keep_alive_s) or 0.0,
        max_connections=node.integer("max_connections", d.max_connections, minimum=1)
        or d.max_connections,
    )


def _session(node: Node) -> SessionConfig:
    fallbacks = node.raw("fallbacks") or []
    if not isinstance(fallbacks, list) or not all(isinstance(f, str) for f in fallbacks):
        node.bad("fallbacks", f"must be a list of strings, got {show(fallbacks)}")
        fallbacks = []
    for i, f in enumerate(fallbacks):
        if f not in ("body.user", "body.metadata.session_id") and not f.startswith("header:"):
            report(
                ConfigError(
                    f"{node.at('fallbacks')}[{i}]",
                    f"must be body.user, body.metadata.session_id or header:NAME, got {f!r}",
                )
            )
    return SessionConfig(
        header=node.text("header", "X-Session-Id") or "X-Session-Id",
        fallbacks=tuple(fallbacks),
        agents=_agents(node),
        ttl_s=duration(node, "ttl"),
        anonymous_tenant=node.text("anonymous_tenant"),
    )


def _agents(session: Node) -> AgentSessions:
    """``session.agents``: a mapping of switches, or ``false`` for none of them."""
    raw = session.raw("agents")
    if raw is None or raw is True:
        return AgentSessions()
    if raw is False:
        return AgentSessions(codex=False, claude_code=False, prompt_cache_key=False)
    if not isinstance(raw, Mapping):
        session.bad("agents", f"must be a mapping or true/false, got {show(raw)}")
        return AgentSessions()
    node = session.child("agents", AGENT_KEYS)
    d = AgentSessions()
    return AgentSessions(
        codex=node.flag("codex", d.codex),
        claude_code=node.flag("claude_code", d.claude_code),
        prompt_cache_key=node.flag("prompt_cache_key", d.prompt_cache_key),
    )


def _admin(node: Node) -> AdminConfig:
    raw = node.raw("api_key")
    if raw is None:
        return AdminConfig()
    if not isinstance(raw, EnvStr) and not (isinstance(raw, str) and raw.startswith(ENV_PREFIX)):
        # The admin key reads and deletes every tenant's history: keep it out of the file.
        raise ConfigError(
            node.at("api_key"), "must be an os.environ/NAME reference, not the key itself"
        )
    return AdminConfig(api_key=node.text("api_key", env=True))


def _upstream_at(name: str, raw: Any) -> UpstreamConfig:
    node = Node(
        f"upstreams.{name}",
        raw,
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
            "api",
            "system_messages",
            "context_window",
            "context_windows",
        },
    )
    return _upstream(name, node)


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
    api = node.text("api", "openai")
    if api not in ("openai", "anthropic"):
        raise ConfigError(node.at("api"), f"must be openai or anthropic, got {api!r}")
    if api == "anthropic" and base_url is None:
        raise ConfigError(node.at("api"), "anthropic needs a base_url (the Messages API's /v1)")
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
        cache=_cache(node.child("cache", {"breakpoints", "prompt_cache_key", "slots"})),
        api="anthropic" if api == "anthropic" else "openai",
        system_messages=_system_messages(node),
        context_window=node.integer("context_window", minimum=1),
        context_windows=_context_windows(node),
    )


def _system_messages(node: Node) -> Literal["all", "first", "none"]:
    value = node.text("system_messages", "all")
    if value == "first":
        return "first"
    if value == "none":
        return "none"
    if value != "all":
        node.bad("system_messages", f"must be all, first or none, got {value!r}")
    return "all"


def _context_windows(node: Node) -> dict[str, int]:
    raw = node.raw("context_windows") or {}
    if not isinstance(raw, Mapping):
        node.bad("context_windows", f"must be a mapping of model names to tokens, got {raw!r}")
        return {}
    windows = Node(node.at("context_windows"), raw, {str(k) for k in raw})
    out: dict[str, int] = {}
    for model in raw:
        tokens = windows.integer(str(model), minimum=1)
        if tokens is not None:
            out[str(model)] = tokens
    return out


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
        slots=node.integer("slots", minimum=1),
    )


def _policy_at(name: str, raw: Any, base_dir: Path, upstreams: Mapping[str, Any]) -> PolicySpec:
    return _policy(name, Node(f"policies.{name}", raw, ANY), base_dir, upstreams)


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


def _routes(
    raw_routes: Any, upstreams: Mapping[str, Any], policies: Mapping[str, Any], base_dir: Path
) -> Any:
    if not isinstance(raw_routes, list) or not raw_routes:
        raise ConfigError("routes", "must be a non-empty list")
    routes = []
    for i, r in enumerate(raw_routes):
        route = section(_route_at, i, r, upstreams, policies, base_dir)
        if route is not None:
            routes.append(route)
    return tuple(routes)


def _route_at(
    index: int,
    raw: Any,
    upstreams: Mapping[str, Any],
    policies: Mapping[str, Any],
    base_dir: Path,
) -> RouteConfig:
    keys = {
        "name",
        "match",
        "upstream",
        "policy",
        "history",
        "modes",
        "compaction",
        "compaction_summarizer",
    }
    return _route(index, Node(f"routes[{index}]", raw, keys), upstreams, policies, base_dir)


def _route(
    index: int,
    node: Node,
    config_upstreams: Mapping[str, Any],
    pols: Mapping[str, Any],
    base_dir: Path,
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
    compaction, compaction_summarizer = route_compaction(node, base_dir, config_upstreams)
    return RouteConfig(
        name=node.text("name") or f"routes[{index}]",
        match=RouteMatch(path=path, model=match.text("model"), headers=match.str_map("headers")),
        upstream=upstream,
        policy=policy,
        history="server" if history == "server" else "client",
        modes=route_modes(node),
        compaction=compaction,
        compaction_summarizer=compaction_summarizer,
    )


def parse_config(
    data: Any, source: str | None = None, *, problems: Sequence[ConfigError] = ()
) -> Config:
    """The typed config; a ConfigErrors (a ConfigError) listing every problem otherwise.

    ``problems`` found before parsing (duplicate keys) are reported with the rest.
    """
    # Relative paths (store.path, a summarizer's prompt_file) are the config file's.
    folder = Path(source).absolute().parent if source else None
    with collecting(folder):
        for problem in problems:
            report(problem)
        config = _parse(resolve_env(data), source, folder or Path.cwd())
    assert config is not None  # collecting() raised if any part failed
    return config


def _parse(data: Any, source: str | None, base_dir: Path) -> Config | None:
    root = section(
        Node,
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
            "cache",
        },
    )
    if root is None:
        return None
    ups = root.raw("upstreams")
    if not isinstance(ups, Mapping) or not ups:
        report(ConfigError("upstreams", "must be a non-empty mapping of name to upstream"))
        ups = {}
    upstreams: dict[str, UpstreamConfig] = {}
    for name, body in ups.items():
        upstream = section(_upstream_at, str(name), body)
        if upstream is not None:
            upstreams[str(name)] = upstream
    # What routes and summarizers may name: an upstream with a problem of its own
    # is still a name, so the reference is not reported as well.
    upstream_names: Mapping[str, Any] = {**{str(n): None for n in ups}, **upstreams}
    raw_policies = root.raw("policies") or {}
    if not isinstance(raw_policies, Mapping):
        report(ConfigError("policies", f"must be a mapping, got {show(raw_policies)}"))
        raw_policies = {}
    # Built in: passthrough and the three context modes (the file may redefine a mode).
    policies: dict[str, PolicySpec] = {"passthrough": NoneSpec(), **BUILTIN_MODES}
    for name, body in raw_policies.items():
        spec = section(_policy_at, str(name), body, base_dir, upstream_names)
        if spec is not None:
            policies[str(name)] = spec
    policy_names: Mapping[str, Any] = {**{str(n): None for n in raw_policies}, **policies}
    routes = section(lambda: _routes(root.raw("routes"), upstream_names, policy_names, base_dir))
    logging = section(lambda: _logging(root.child("logging", {"level", "format"})))
    store = section(lambda: store_config(root.child("store", STORE_KEYS)))
    coordination = section(
        lambda: coordination_config(root.child("coordination", COORDINATION_KEYS))
    )
    if store is not None and coordination is not None:
        section(check_coordination, store, coordination)
    server = section(lambda: _server(root.child("server", SERVER_KEYS), base_dir))
    session = section(lambda: _session(root.child("session", SESSION_KEYS)))
    admin = section(lambda: _admin(root.child("admin", {"api_key"})))
    cache = section(lambda: _memory(root.child("cache", {"max_bytes"})))
    if routes is None or logging is None or store is None or server is None:
        return None
    if session is None or admin is None or coordination is None or cache is None:
        return None
    return Config(
        upstreams=upstreams,
        routes=routes,
        policies=policies,
        server=server,
        session=session,
        store=store,
        coordination=coordination,
        logging=logging,
        admin=admin,
        cache=cache,
        source=source,
    )


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
}
# Below this the caches could not hold one long session: surely a mistake.
MIN_CACHE_BYTES = 2**20


def byte_size(node: Node, key: str, default: int, minimum: int) -> int:
    """A size in bytes: an integer, or a number with a unit (``256MiB``, ``1.5GB``, ``512KiB``)."""
    if not node.has(key):
        return default
    value = node.raw(key)
    size: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str):
        found = _SIZE.fullmatch(value.strip())
        if found is not None:
            unit = (found.group(2) or "b").lower()
            size = int(float(found.group(1)) * _SIZE_UNITS[unit])
    if size is None:
        node.bad(key, f"must be a size like 256MiB, 1GB or a number of bytes, got {show(value)}")
        return default
    if size < minimum:
        node.bad(key, f"must be at least {minimum} bytes (1MiB), got {show(value)}")
        return default
    return size


def _memory(node: Node) -> MemoryConfig:
    d = MemoryConfig()
    return MemoryConfig(max_bytes=byte_size(node, "max_bytes", d.max_bytes, MIN_CACHE_BYTES))


def _logging(log: Node) -> LoggingConfig:
    level = (log.text("level", "info") or "info").lower()
    if level not in ("debug", "info", "warning", "error"):
        log.bad("level", f"must be debug, info, warning or error, got {level!r}")
        level = "info"
    fmt = log.text("format", "auto") or "auto"
    if fmt not in ("auto", "json", "console"):
        log.bad("format", f"must be auto, json or console, got {fmt!r}")
        fmt = "auto"
    return LoggingConfig(level=level, format=fmt)  # type: ignore[arg-type]


def read_yaml(path: str | Path) -> tuple[Any, list[ConfigError]]:
    """The file's YAML and its duplicate keys; ConfigError if unreadable or not YAML."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {str(p)!r}: {exc.strerror}") from exc
    try:
        return yaml.safe_load(text), duplicate_keys(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{p}: invalid YAML: {exc}") from exc


def load_config(path: str | Path) -> Config:
    data, duplicates = read_yaml(path)
    return parse_config(data, source=str(path), problems=duplicates)


def store_section(data: Any, source: str | Path) -> StoreConfig:
    """Only the file's ``store`` section (its ``os.environ/`` and relative path resolved).

    What the session commands need, without the rest of the file: resolving
    it all would demand every secret it names (upstream and admin keys).
    """
    with collecting(Path(source).absolute().parent):
        raw = data.get("store") if isinstance(data, Mapping) else None
        store = section(lambda: store_config(Node("store", resolve_env(raw, "store"), STORE_KEYS)))
    assert store is not None  # collecting() raised otherwise
    return store


def describe(exc: ConfigError, path: str | Path) -> str:
    """A config error for a terminal: every problem on its own line."""
    if isinstance(exc, ConfigErrors) and len(exc.errors) > 1:
        lines = "".join(f"\n  {e}" for e in exc.errors)
        return f"config error: {path}: {len(exc.errors)} problems{lines}"
    return f"config error: {exc}"
