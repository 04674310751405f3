"""Hints that help a provider's prompt cache: ``prompt_cache_key`` and Anthropic breakpoints.

Both are documented rewrites of what the client sent (docs/guides/prompt-caching.md):

- **OpenAI-compatible upstreams** route a request to a cache machine by a hash
  of its prefix, and ``prompt_cache_key`` narrows that to one key: the
  proxy sends one per session (an opaque hash of tenant and session, never the
  session id itself) unless the client sent its own. Spliced into the
  client's bytes before the closing brace: every other byte stays as it came.
- **Anthropic** caches only prefixes that end at a ``cache_control``
  breakpoint (at most 4 per request). The proxy marks the end of what the
  policy keeps stable: the leading system block (system messages and the
  summary), the last message before the newest turn, and the newest message
  (so the next request of an agent loop reads all of this one), never a
  message the client marked itself, and never past the limit counting the
  client's own. litellm turns a message-level ``cache_control`` (or one on a
  content part or tool call) into Anthropic's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

EPHEMERAL: Mapping[str, str] = {"type": "ephemeral"}
MAX_BREAKPOINTS = 4
SYSTEM_ROLES = frozenset({"system", "developer"})
# litellm providers that serve Anthropic's models with Anthropic's prompt caching.
_ANTHROPIC_PROVIDERS = frozenset({"anthropic", "bedrock", "bedrock_converse", "vertex_ai"})


def session_cache_key(tenant: str, session: str) -> str:
    """A session's ``prompt_cache_key``: stable, opaque, short (providers cap its length)."""
    digest = hashlib.blake2b(f"{tenant}\x00{session}".encode(), digest_size=16).hexdigest()
    return f"ctxproxy-{digest}"


def session_slot(tenant: str, session: str, slots: int) -> int:
    """The llama.cpp slot a session keeps (``id_slot``): the same one on every request."""
    digest = hashlib.blake2b(f"{tenant}\x00{session}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % slots


def splice_field(raw: bytes, name: str, value: str | int) -> bytes:
    """``raw`` (a JSON object without ``name``) with ``"name": value`` inserted before its
    closing brace: every byte of ``raw`` stays, in order."""
    close = len(raw.rstrip()) - 1
    if close < 0 or raw[close : close + 1] != b"}":
        raise ValueError("not a JSON object")
    comma = b"" if raw[:close].rstrip().endswith(b"{") else b","
    return raw[:close] + comma + orjson.dumps(name) + b":" + orjson.dumps(value) + raw[close:]


def is_anthropic(litellm_model: str | None) -> bool:
    """Whether a litellm model is Claude behind a provider that honours ``cache_control``."""
    if not litellm_model:
        return False
    provider, _, model = litellm_model.partition("/")
    if provider == "anthropic":
        return True
    return provider in _ANTHROPIC_PROVIDERS and "claude" in model.lower()


def _marked(message: Mapping[str, Any]) -> bool:
    """Whether the client put a breakpoint on this message (anywhere in it)."""
    if message.get("cache_control") is not None:
        return True
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if isinstance(part, Mapping) and part.get("cache_control") is not None:
                return True
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            if isinstance(call, Mapping) and call.get("cache_control") is not None:
                return True
    return False


def client_breakpoints(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> int:
    """Breakpoints the client placed itself (messages and tool definitions)."""
    n = sum(1 for m in messages if _marked(m))
    if isinstance(tools, list):
        n += sum(1 for t in tools if isinstance(t, Mapping) and t.get("cache_control"))
    return n


def _with_breakpoint(message: Mapping[str, Any]) -> dict[str, Any] | None:
    """A copy of ``message`` carrying a breakpoint at its end; None if it cannot carry one."""
    content = message.get("content")
    if isinstance(content, str) and content:
        return {**message, "cache_control": dict(EPHEMERAL)}
    if isinstance(content, list) and content:
        last = content[-1]
        if isinstance(last, Mapping):
            return {
                **message,
                "content": [*content[:-1], {**last, "cache_control": dict(EPHEMERAL)}],
            }
        return None
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls and isinstance(calls[-1], Mapping):
        marked = {**calls[-1], "cache_control": dict(EPHEMERAL)}
        return {**message, "tool_calls": [*calls[:-1], marked]}
    return None


def breakpoint_targets(messages: Sequence[Mapping[str, Any]]) -> list[int]:
    """Where the stable prefix ends, most valuable first (indexes into ``messages``).

    The last message before the newest turn (what the next request will
    share), the end of the leading system block (survives even a new trim
    cut), and the newest message.
    """
    n = len(messages)
    if not n:
        return []
    newest_user = next((i for i in range(n - 1, -1, -1) if messages[i].get("role") == "user"), None)
    system_end = -1
    while system_end + 1 < n and messages[system_end + 1].get("role") in SYSTEM_ROLES:
        system_end += 1
    targets: list[int] = []
    if newest_user is not None and newest_user - 1 > system_end:
        targets.append(newest_user - 1)
    if system_end >= 0:
        targets.append(system_end)
    targets.append(n - 1)
    return list(dict.fromkeys(targets))


def with_breakpoints(
    messages: Sequence[Mapping[str, Any]], tools: Any = None
) -> tuple[list[Mapping[str, Any]], list[int]]:
    """``messages`` with breakpoints at the stable prefix's end, and where they went.

    Only the marked messages are copies; the others are the same objects.
    """
    room = MAX_BREAKPOINTS - client_breakpoints(messages, tools)
    out = list(messages)
    placed: list[int] = []
    for i in breakpoint_targets(messages):
        if room <= 0:
            break
        if _marked(messages[i]):
            continue
        marked = _with_breakpoint(messages[i])
        if marked is None:
            continue
        out[i] = marked
        placed.append(i)
        room -= 1
    return out, sorted(placed)
