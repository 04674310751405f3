"""The config file's JSON Schema: editors complete and check `config.example.yaml` with it.

Published by ``ctxproxy schema`` and committed as ``config.schema.json``
(tests/config/test_schema.py fails when either drifts: from each other, or
from the keys the loader reads). The loader stays the judge: cross-key rules
(a route's upstream must exist, ``keep_last_turns <= trigger.turns``) are
its alone; this describes each key's type, range and meaning.

A new key: add it where the loader reads it *and* here (the test names what is missing).
"""

from __future__ import annotations

from typing import Any

from policies.modes import MODES

Schema = dict[str, Any]

ENV = {"type": "string", "pattern": r"^os\.environ/[A-Za-z_][A-Za-z0-9_]*$"}


def obj(description: str, properties: Schema, **extra: Any) -> Schema:
    """A mapping with exactly these keys (unknown keys are an error, as in the loader)."""
    return {
        "type": "object",
        "description": description,
        "properties": properties,
        "additionalProperties": False,
        **extra,
    }


def text(description: str, **extra: Any) -> Schema:
    return {"type": "string", "description": description, **extra}


def integer(description: str, minimum: int, maximum: int | None = None) -> Schema:
    plain: Schema = {"type": "integer", "minimum": minimum}
    if maximum is not None:
        plain["maximum"] = maximum
    # An os.environ/NAME reference holding a number is accepted too.
    return {"description": description, "anyOf": [plain, {"$ref": "#/$defs/env"}]}


def number(description: str, high: float | None = None) -> Schema:
    plain: Schema = {"type": "number", "exclusiveMinimum": 0}
    if high is not None:
        plain["maximum"] = high
    return {"description": description, "anyOf": [plain, {"$ref": "#/$defs/env"}]}


def boolean(description: str) -> Schema:
    return {"type": "boolean", "description": description}


def choice(description: str, *values: str) -> Schema:
    return {"type": "string", "description": description, "enum": list(values)}


def string_map(description: str) -> Schema:
    return {
        "type": "object",
        "description": description,
        "additionalProperties": {"type": "string"},
    }


SERVER = obj(
    "Where the proxy listens (a change needs a restart).",
    {
        "host": text("Address to listen on.", default="127.0.0.1"),
        "port": integer("Port to listen on (default 8080).", 1, 65535),
        "max_body_bytes": integer("Largest request body accepted; larger ones get a 413.", 1024),
        "client_keys": {
            "description": "Keys clients must present (os.environ/NAME references, "
            "{name, key} entries, or {file: PATH} of 'NAME SHA256' lines); omitted: open.",
            "anyOf": [
                {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "anyOf": [
                            {"type": "string"},
                            obj(
                                "A named key.",
                                {"name": text("The tenant."), "key": text("os.environ/NAME.")},
                            ),
                        ]
                    },
                },
                obj("A file of hashed keys.", {"file": text("Path, relative to the config file.")}),
            ],
        },
        "header_timeout_s": number("Seconds a request's headers may take to arrive."),
        "body_timeout_s": number("Seconds without a body chunk before a 408."),
        "keep_alive_s": number("Seconds an idle keep-alive connection is kept."),
        "max_connections": integer("Connections plus requests at once; more get a 503.", 1),
    },
)

SESSION = obj(
    "How a request names its conversation.",
    {
        "header": text("Request header that names the session.", default="X-Session-Id"),
        "fallbacks": {
            "type": "array",
            "description": "Where else to look, in order, when the header is absent.",
            "items": {
                "anyOf": [
                    {"enum": ["body.user", "body.metadata.session_id"]},
                    {"type": "string", "pattern": "^header:.+"},
                ]
            },
        },
        "agents": {
            "description": "Session ids known clients send themselves, read when the header and "
            "the fallbacks name none (docs/guides/agents-sessions.md); false: none of them.",
            "anyOf": [
                {"type": "boolean"},
                obj(
                    "Each source, switchable off (all on by default).",
                    {
                        "codex": boolean(
                            "Codex CLI: the session-id header (session_id), then thread-id."
                        ),
                        "claude_code": boolean(
                            "Claude Code: X-Claude-Code-Session-Id; a sub-agent "
                            "(X-Claude-Code-Agent-Id) is <session>/agent/<id>."
                        ),
                        "prompt_cache_key": boolean(
                            "Last resort: the body's prompt_cache_key names the session."
                        ),
                    },
                ),
            ],
        },
        "ttl": text(
            "Delete sessions idle this long (30m, 12h, 7d); omitted: kept forever.",
            pattern=r"^\s*\d+(\.\d+)?\s*[smhd]\s*$",
        ),
        "anonymous_tenant": text(
            "Tenant for requests without an API key; omitted: nothing of them is stored."
        ),
    },
)

STORE = obj(
    "Where sessions are stored (a change needs a restart).",
    {
        "path": text("SQLite file, relative to this file's folder.", default="./data/ctxproxy.db"),
        "url": text(
            "A shared store instead of path: postgresql://..., redis://... (os.environ/NAME).",
            pattern=r"^(postgresql|postgres|redis|rediss|unix)://|^os\.environ/",
        ),
        "pool_size": integer("PostgreSQL connections per instance.", 1),
        "key_prefix": text(
            "Redis store: the prefix of every key it writes.", pattern="^[A-Za-z0-9_.:-]{1,64}$"
        ),
        "schema": text(
            "PostgreSQL schema for the tables (created if missing).",
            pattern="^[a-z_][a-z0-9_]{0,62}$",
        ),
    },
)

COORDINATION = obj(
    "How instances sharing a store agree; required with store.url.",
    {
        "redis_url": text(
            "Redis for session locks and summary flights (os.environ/NAME).",
            pattern=r"^(redis|rediss|unix)://|^os\.environ/",
        ),
        "key_prefix": text("Every Redis key starts with this.", pattern="^[A-Za-z0-9_.:-]{1,64}$"),
        "lock_lease": text(
            "A crashed instance's session lock expires after this long (15s).",
            pattern=r"^\s*\d+(\.\d+)?\s*[smhd]\s*$",
        ),
        "lock_wait": text(
            "Longest a history: server request waits for its session (120s).",
            pattern=r"^\s*\d+(\.\d+)?\s*[smhd]\s*$",
        ),
        "single_instance": boolean("A shared store used by exactly one instance, no Redis."),
    },
)

ADMIN = obj(
    "The admin API (/admin/...); omitted: every /admin call is a 401.",
    {
        "api_key": {
            "$ref": "#/$defs/env",
            "description": "An os.environ/NAME reference, never the key.",
        }
    },
)

LOGGING = obj(
    "Log lines (structlog).",
    {
        "level": choice("Lowest level logged.", "debug", "info", "warning", "error"),
        "format": choice("auto: JSON when stdout is not a terminal.", "auto", "json", "console"),
    },
)

CACHE = obj(
    "The in-memory caches (per-session messages, chains, histories, token counts): one budget.",
    {
        "max_bytes": {
            "description": "What all of them may hold, estimated: bytes, or a size like"
            " 256MiB or 1GB (default 1GiB; at least 1MiB).",
            "anyOf": [
                {"type": "integer", "minimum": 2**20},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([KkMmGg][Ii]?[Bb]|[Bb])?\s*$"},
            ],
        },
    },
)

UPSTREAM = obj(
    "An OpenAI-compatible API (base_url) or any provider litellm translates (litellm_model).",
    {
        "base_url": text("Base URL of an OpenAI-compatible API, e.g. https://api.openai.com/v1."),
        "litellm_model": text(
            "A model name litellm understands, e.g. anthropic/claude-sonnet-4-5."
        ),
        "api_base": text("The provider's base URL, for litellm_model."),
        "api_key": text("Key sent upstream (os.environ/NAME); omitted: the client's own."),
        "timeout_s": number("Longest wait between two bytes of the answer, in seconds."),
        "connect_timeout_s": number("Longest wait to open a connection, in seconds."),
        "headers": string_map("Extra headers sent upstream on every request."),
        "responses": choice(
            "How /v1/responses reaches it: native (its own) or bridge (via chat completions).",
            "native",
            "bridge",
        ),
        "api": choice(
            "What base_url speaks: openai, or anthropic (/v1/messages forwarded natively).",
            "openai",
            "anthropic",
        ),
        "system_messages": choice(
            "Which system messages its chat template shows the model: all, the first, or none "
            "(below all, summaries go as a user/assistant pair).",
            "all",
            "first",
            "none",
        ),
        "context_window": integer("Input tokens every model it serves accepts.", 1),
        "context_windows": {
            "type": "object",
            "description": "Input tokens per model name it serves.",
            "additionalProperties": integer("Input tokens.", 1),
        },
        "cache": obj(
            "Prompt-cache hints the proxy adds.",
            {
                "breakpoints": choice(
                    "auto: Anthropic cache_control breakpoints for Claude behind litellm.",
                    "auto",
                    "off",
                ),
                "prompt_cache_key": choice(
                    "session: a prompt_cache_key per session (OpenAI-compatible).", "session", "off"
                ),
                "slots": integer(
                    "A llama.cpp server's slots (--parallel): each session keeps one (id_slot).", 1
                ),
            },
        ),
    },
    oneOf=[{"required": ["base_url"]}, {"required": ["litellm_model"]}],
)

MODES_SCHEMA = obj(
    "How a request may switch to another context mode.",
    {
        "header": boolean("Honour the request's X-Context-Mode header."),
        "rules": {
            "type": "array",
            "description": "The first rule whose regex matches the latest user message wins.",
            "items": obj(
                "A mode rule.",
                {
                    "match": text("A Python regular expression."),
                    "mode": choice("The mode it selects.", *MODES),
                    "name": text("Named in X-Context-Mode-Rule when it fires (default rules[N])."),
                },
                required=["match", "mode"],
            ),
        },
    },
)

SUMMARIZER = obj(
    "Who writes the summary.",
    {
        "model": text("Default: the request's model; ctxproxy/extractive: offline stand-in."),
        "upstream": text("A key of upstreams (default: the route's)."),
        "max_tokens": integer("The summary's length.", 16),
        "prompt_file": text("Instructions replacing the built-in prompt; relative to this file."),
        "timeout_s": number("Longest wait; then the request is trimmed instead."),
        "context_window": integer(
            "Input tokens the summarizer model reads (default: the model's known window); "
            "a longer range is summarized in chunks.",
            256,
        ),
    },
)

ROUTE = obj(
    "A route: the first whose match fits the request serves it.",
    {
        "name": text("Name used in logs and stored rows (default routes[N])."),
        "match": obj(
            "What the request must look like (globs).",
            {
                "path": text("Glob on the request path.", default="/v1/chat/completions"),
                "model": text("Glob on the body's model (omitted: any)."),
                "headers": string_map("Globs on request headers."),
            },
        ),
        "upstream": text("A key of upstreams."),
        "policy": text(
            "A key of policies (built in: passthrough, concise, balanced, full).",
            default="passthrough",
        ),
        "history": choice(
            "client: the client sends the whole history; server: only new messages.",
            "client",
            "server",
        ),
        "modes": MODES_SCHEMA,
        "compaction": choice(
            "Who answers compaction: auto (OpenAI's API for api.openai.com, else the proxy).",
            "auto",
            "proxy",
            "upstream",
            "off",
        ),
        "compaction_summarizer": {
            **SUMMARIZER,
            "description": "Who writes the proxy's compaction summaries (default: the route's).",
        },
    },
    required=["upstream"],
)

MASK = {
    "description": "Replace old, large tool results by a placeholder (true: the defaults).",
    "anyOf": [
        {"type": "boolean"},
        obj(
            "When a tool result is masked.",
            {
                "after_turns": integer("Results older than this many turns.", 1),
                "min_tokens": integer("Results at least this long.", 32),
                "step_tokens": integer("Mask in steps of this many tokens (cache-friendly).", 0),
            },
        ),
    ],
}

RECALL = obj(
    "Bring back the left-out turns the newest message needs (a share of the budget, or tokens).",
    {
        "max_tokens": integer(
            "The recall block's budget in tokens (at most half the policy's).", 16
        ),
        "share": number("Or this share of the policy's budget (default 0.3).", 0.9),
        "neighbors": integer(
            "How far (messages) each hit lends its score to the messages around it.", 0, 5
        ),
        "embeddings": choice(
            "none: lexical search; wordllama: lexical and semantic (a bundled model), fused.",
            "none",
            "wordllama",
        ),
        "candidates": integer("Hits the index is asked for.", 1, 500),
        "expand": boolean(
            "Lexical recall searches again with the words of its best hits (a second search)."
        ),
        "semantic_weight": {
            "description": "The semantic share of the fused score (needs embeddings: wordllama).",
            "anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"$ref": "#/$defs/env"}],
        },
    },
)

NONE_POLICY = obj(
    "Forward the conversation unchanged.",
    {"strategy": {"const": "none"}, "mask_tool_outputs": MASK},
)

TRIM_POLICY = obj(
    "Keep the newest turns that fit; turns are dropped whole.",
    {
        "strategy": {"const": "trim"},
        "max_turns": integer("Keep the newest N user turns.", 1),
        "max_tokens": integer("Token budget of the messages.", 1),
        "context_fraction": number("Or this share of the model's context window.", 1.0),
        "low_water": number("When over budget, cut down to this share of it.", 1.0),
        "tool_output_max_tokens": integer("Clip larger tool results first.", 16),
        "mask_tool_outputs": MASK,
        "recall": RECALL,
    },
    required=["strategy"],
)

SUMMARIZE_POLICY = obj(
    "Fold older turns into a stored, incremental summary.",
    {
        "strategy": {"const": "summarize"},
        "trigger": obj(
            "Summarize when the history passes either.",
            {"turns": integer("Turns.", 1), "tokens": integer("Tokens.", 1)},
        ),
        "keep_last_turns": integer("Turns kept verbatim; <= trigger.turns.", 1),
        "keep_first_turns": integer("Opening turns also kept verbatim.", 0),
        "max_tokens": integer("Budget of what is forwarded.", 1),
        "low_water": number("A new summary leaves the kept turns within this share.", 1.0),
        "summary_share": number("The summary's share of the budget at most.", 1.0),
        "tool_output_max_tokens": integer("Clip larger tool results in kept turns.", 16),
        "summarizer": SUMMARIZER,
        "placement": choice("Where the summary goes.", "system", "pair"),
        "prefetch": boolean("Make the next summary after the answer is sent."),
        "recall": RECALL,
    },
    required=["strategy"],
)


def config_schema() -> Schema:
    """The whole file's schema (JSON Schema draft 2020-12)."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "ctxproxy config",
        **obj(
            "The proxy's YAML config; every string value may be an os.environ/NAME reference.",
            {
                "server": SERVER,
                "session": SESSION,
                "store": STORE,
                "coordination": COORDINATION,
                "upstreams": {
                    "type": "object",
                    "description": "Named upstreams.",
                    "minProperties": 1,
                    "additionalProperties": UPSTREAM,
                },
                "routes": {
                    "type": "array",
                    "description": "First match wins; no match is a 404.",
                    "minItems": 1,
                    "items": ROUTE,
                },
                "policies": {
                    "type": "object",
                    "description": "Named context policies.",
                    "additionalProperties": {
                        "anyOf": [NONE_POLICY, TRIM_POLICY, SUMMARIZE_POLICY],
                    },
                },
                "logging": LOGGING,
                "admin": ADMIN,
                "cache": CACHE,
            },
            required=["upstreams", "routes"],
        ),
        "$defs": {"env": ENV},
    }
