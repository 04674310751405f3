"""The config's typed objects: frozen dataclasses, built once by the loader."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from policies.modes import ModeRule
from policies.types import PolicySpec, SummarizerSpec

ENV_PREFIX = "os.environ/"
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class ModesConfig:
    """A route's `modes`: may the request pick one (header), and rules on its latest message."""

    header: bool = False
    rules: tuple[ModeRule, ...] = ()


@dataclass(frozen=True)
class ClientKey:
    """A key clients must present (server.client_keys): its name is the tenant."""

    name: str
    # sha256 of the key, hex: the proxy never holds the keys themselves.
    sha256: str = field(repr=False)


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Empty: no client keys, the proxy is open to whoever reaches it
    # (docs/operations/reliability-and-tenancy.md).
    client_keys: tuple[ClientKey, ...] = ()
    # Slow clients: a request's headers must arrive within header_timeout_s of the
    # connection (or of the previous response), each body chunk within body_timeout_s;
    # an idle keep-alive connection is closed after keep_alive_s; at most
    # max_connections connections and requests at once (more get a 503).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 1024


@dataclass(frozen=True)
class AgentSessions:
    """Session ids that known clients send of their own accord, read without configuration
    when neither the configured header nor a fallback names the session
    (proxy/http/session_lookup.py, docs/guides/agents-sessions.md). Each can be switched off."""

    # Codex CLI: the ``session-id`` header (``session_id`` before 0.1xx), then ``thread-id``.
    codex: bool = True
    # Claude Code: ``X-Claude-Code-Session-Id``; a sub-agent (``X-Claude-Code-Agent-Id``)
    # is a session of its own, ``<session>/agent/<agent id>``.
    claude_code: bool = True
    # The body's ``prompt_cache_key``, the last resort: clients that set one per conversation.
    prompt_cache_key: bool = True


@dataclass(frozen=True)
class SessionConfig:
    header: str = "X-Session-Id"
    # Where else to look, in order: "body.user", "body.metadata.session_id".
    fallbacks: tuple[str, ...] = ()
    # Known agents' own session ids, read after the header and the fallbacks.
    agents: AgentSessions = AgentSessions()
    # session.ttl in seconds: sessions idle longer are deleted. None: kept forever.
    ttl_s: float | None = None
    # The tenant of requests without an API key. None: such requests are
    # proxied but nothing of them is stored (anyone could read it back).
    anonymous_tenant: str | None = None


@dataclass(frozen=True)
class StoreConfig:
    path: str = "./data/ctxproxy.db"
    # A shared store (postgresql://..., redis://...); None: SQLite at ``path``.
    # Out of repr: the URL may carry a password.
    url: str | None = field(default=None, repr=False)
    # PostgreSQL: connections per instance, and the schema the tables live in.
    pool_size: int = 10
    schema: str | None = None
    # Redis: the prefix of every key the store writes ("<key_prefix>:...").
    key_prefix: str = "ctxproxy:store"


@dataclass(frozen=True)
class CoordinationConfig:
    """How instances sharing a store agree (proxy/coordination/); None URL: in-process."""

    redis_url: str | None = field(default=None, repr=False)
    key_prefix: str = "ctxproxy"
    # A session lock's lease: a crashed holder's lock expires after this long.
    lock_lease_s: float = 15.0
    # How long a ``history: server`` request waits for its session's lock.
    lock_wait_s: float = 120.0
    # A shared store without Redis: allowed only when stated that one instance uses it.
    single_instance: bool = False


@dataclass(frozen=True)
class CacheConfig:
    """An upstream's `cache`: prompt-cache hints the proxy adds (docs/guides/prompt-caching.md)."""

    # "auto": Anthropic cache_control breakpoints for Claude models behind litellm.
    breakpoints: Literal["auto", "off"] = "auto"
    # "session": a prompt_cache_key per session for OpenAI-compatible upstreams.
    prompt_cache_key: Literal["session", "off"] = "session"
    # A llama.cpp server's slots (its --parallel): each session is pinned to one
    # (``id_slot``), so another session's prompt never evicts its cached prefix.
    slots: int | None = None


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    # An OpenAI-compatible upstream has a base URL ...
    base_url: str | None = None
    # ... or names a litellm model that translates to another provider.
    litellm_model: str | None = None
    api_base: str | None = None
    # None: forward the client's own Authorization header.
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    headers: Mapping[str, str] = field(default_factory=dict)
    # How /v1/responses reaches it: "native" forwards to its own /responses;
    # "bridge" translates to chat completions and back (litellm_model: always).
    responses: Literal["native", "bridge"] = "native"
    cache: CacheConfig = CacheConfig()
    # Which API ``base_url`` speaks: "openai" (chat completions, Responses) or
    # "anthropic" (the Messages API: /v1/messages is forwarded to it natively).
    api: Literal["openai", "anthropic"] = "openai"

    @property
    def anthropic(self) -> bool:
        """Whether /v1/messages goes to this upstream as it came (no translation)."""
        return self.api == "anthropic" and self.base_url is not None

    # How the model's chat template treats system messages: "all" reach it
    # (OpenAI, Anthropic, most templates); "first": only a leading one does
    # (llama-cpp-python's default formats); "none": all are dropped (its gemma
    # format). Below "all", summaries go as a user/assistant pair and the
    # summarizer's instructions in its user message (docs/guides/local-models.md).
    system_messages: Literal["all", "first", "none"] = "all"
    # Input tokens the models it serves accept: one figure for all, or per model
    # name (None: the model map's, else what the server itself says, when it says).
    context_window: int | None = None
    context_windows: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RouteMatch:
    path: str = "/v1/chat/completions"
    model: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


# A compaction summary stands for a whole conversation: a longer answer than a policy's.
COMPACTION_SUMMARIZER = SummarizerSpec(max_tokens=1000)


@dataclass(frozen=True)
class RouteConfig:
    name: str
    match: RouteMatch
    upstream: str
    policy: str
    history: Literal["client", "server"] = "client"
    # How a request may switch between the context modes (None: it may not).
    modes: ModesConfig | None = None
    # Who answers compaction (a compaction_trigger, /v1/responses/compact,
    # context_management): "auto" passes it to OpenAI's own API and answers it in
    # the proxy for every other upstream (docs/guides/compaction.md).
    compaction: Literal["auto", "proxy", "upstream", "off"] = "auto"
    # Who writes the proxy's compaction summaries (default: the request's model
    # on the route's upstream; the offline extractive summary when it fails).
    compaction_summarizer: SummarizerSpec = COMPACTION_SUMMARIZER


@dataclass(frozen=True)
class LoggingConfig:
    level: str = "info"
    # "auto": JSON when stdout is not a TTY, console otherwise.
    format: Literal["auto", "json", "console"] = "auto"


# What the in-memory caches may hold in all, by default (``cache.max_bytes``). An
# upper bound, not an allocation: sized so that 64 agents with 2,000-message
# histories of each kind (client-held and ``history: server``, ~400 MB held) hit
# on every turn (bench/history.py). Every per-session cache also keeps at most
# 1,024 sessions, so many short sessions hold far less (docs/design/long-sessions.md).
DEFAULT_CACHE_BYTES = 2**30


@dataclass(frozen=True)
class MemoryConfig:
    """The ``cache`` section: one budget for all in-memory caches (proxy.store.base.CacheBudget)."""

    max_bytes: int = DEFAULT_CACHE_BYTES


@dataclass(frozen=True)
class AdminConfig:
    # None: the admin API is disabled (every /admin call is a 401).
    api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Config:
    upstreams: Mapping[str, UpstreamConfig]
    routes: tuple[RouteConfig, ...]
    policies: Mapping[str, PolicySpec]
    server: ServerConfig = ServerConfig()
    session: SessionConfig = SessionConfig()
    store: StoreConfig = StoreConfig()
    coordination: CoordinationConfig = CoordinationConfig()
    logging: LoggingConfig = LoggingConfig()
    admin: AdminConfig = AdminConfig()
    cache: MemoryConfig = MemoryConfig()
    source: str | None = None
