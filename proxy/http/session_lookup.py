"""Which session a request belongs to: the configured header, its fallbacks, then known agents.

The order, first found wins:

1. the configured header (``session.header``, ``X-Session-Id`` by default);
2. the configured fallbacks, in order (``body.metadata.session_id``, ``body.user``,
   ``header:NAME``);
3. known agents' own ids, each switchable off under ``session.agents``:
   - Codex CLI: ``session-id`` (``session_id`` in versions before the rename),
     then ``thread-id``. Codex keeps both for a whole thread, across its
     compaction windows: ``x-codex-window-id`` changes at each compaction and
     is deliberately not read, so a compacted thread stays one session;
   - Claude Code: ``X-Claude-Code-Session-Id``. A sub-agent it starts sends
     its parent's session id with ``X-Claude-Code-Agent-Id``: it is kept apart
     as ``<session>/agent/<agent id>`` (its own history, summaries and recall),
     never mixed into the parent's conversation;
4. the body's ``prompt_cache_key``, the last resort (Codex sets it to its
   session id; other clients set one per conversation).

The configured fallbacks come before the agents: a source a deployment
configured is one it means. (A ``user`` field often names a person rather
than a conversation; a deployment serving coding agents may drop it.)
Every found id is checked the
same way (length, control characters) and the source that named it is kept
(``X-Context-Session-Source``, the log line).

:func:`session_hint` names the session before the body is parsed (the
headers in the same order, then the body's bytes for ``prompt_cache_key``):
the chat pipeline picks whose kept body a resent body continues with it
(proxy/http/resent_body.py), for sessions named by agents as for the
configured header.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.config.model import SessionConfig
from proxy.errors import InvalidRequest

MAX_SESSION_ID = 256

# Codex CLI's headers, most specific first (session_id: Codex before the rename).
CODEX_HEADERS = ("session-id", "session_id", "thread-id")
CLAUDE_CODE_SESSION = "x-claude-code-session-id"
CLAUDE_CODE_AGENT = "x-claude-code-agent-id"
# Between a Claude Code session id and a sub-agent's id in the sub-agent's session key.
AGENT_SEPARATOR = "/agent/"
_CACHE_KEY = b'"prompt_cache_key"'
# The field with a plain string value (an escaped one is no hint: it is parsed whole).
_CACHE_KEY_FIELD = re.compile(rb'"prompt_cache_key"\s*:\s*"([^"\\\x00-\x1f]{1,256})"')


@dataclass(frozen=True)
class FoundSession:
    """A request's session id and where it was found (None, None: no session)."""

    key: str | None
    # "header", "body.user", "header:NAME", "codex:session-id", "claude-code",
    # "claude-code:agent", "prompt_cache_key".
    source: str | None


NO_SESSION = FoundSession(None, None)


def header_text(value: str) -> str:
    """A header value as the client meant it.

    HTTP gives header values as bytes and the ASGI server hands them over read
    as Latin-1, so an id a client sent as raw UTF-8 (what most HTTP libraries
    send for non-ASCII text) arrives as mojibake. Bytes that are valid UTF-8 are
    read as UTF-8; anything else stays Latin-1 (a lone ``\xe9`` is ``é``).
    """
    if value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header's value read by ``header_text`` (None or empty when absent)."""
    value = headers.get(name)
    return header_text(value) if value else value


def find_session(
    config: SessionConfig, headers: Mapping[str, str], body: Mapping[str, Any]
) -> FoundSession:
    """The session id, validated, and its source (module docstring for the order).

    ``headers``: lower-case names (Starlette's Headers, or a dict of them).
    """
    value: Any = _header(headers, config.header.lower())
    if value:
        return _checked(value, config.header, "header")
    for fallback in config.fallbacks:
        if fallback == "body.user":
            value = body.get("user")
        elif fallback == "body.metadata.session_id":
            meta = body.get("metadata")
            value = meta.get("session_id") if isinstance(meta, Mapping) else None
        elif fallback.startswith("header:"):
            value = _header(headers, fallback[len("header:") :].lower())
        if value is not None and value != "":
            return _checked(value, fallback, fallback)
    agents = config.agents
    if agents.codex:
        for name in CODEX_HEADERS:
            value = _header(headers, name)
            if value:
                return _checked(value, name, f"codex:{name}")
    if agents.claude_code:
        value = _header(headers, CLAUDE_CODE_SESSION)
        if value:
            agent = _header(headers, CLAUDE_CODE_AGENT)
            if agent:
                key = value + AGENT_SEPARATOR + agent
                return _checked(key, CLAUDE_CODE_AGENT, "claude-code:agent")
            return _checked(value, CLAUDE_CODE_SESSION, "claude-code")
    if agents.prompt_cache_key:
        value = body.get("prompt_cache_key")
        if value is not None and value != "":
            return _checked(value, "prompt_cache_key", "prompt_cache_key")
    return NO_SESSION


def session_hint(config: SessionConfig, headers: Mapping[str, str], raw: bytes) -> str | None:
    """The session :func:`find_session` is expected to find, before ``raw`` is parsed: a
    hint, never trusted. It picks whose kept body ``raw`` is compared with, byte for byte
    (the comparison, not the hint, makes that parse exact: a wrong hint only misses), and
    the session is then found from the parsed body as for any request.

    The headers, in :func:`find_session`'s order (a configured body field, read only
    once the body is parsed, may name another session: a miss); then the last
    ``"prompt_cache_key"`` in the bytes (a top-level field after the messages is the
    last, as a parse keeps it; one nested elsewhere is a miss). None: no hint.
    """
    try:
        found = find_session(config, headers, {})
    except InvalidRequest:
        return None  # the parse and the lookup say what is wrong
    if found.key is not None or not config.agents.prompt_cache_key:
        return found.key
    at = raw.rfind(_CACHE_KEY)
    field = _CACHE_KEY_FIELD.match(raw, at) if at >= 0 else None
    if field is None:
        return None
    try:
        return field.group(1).decode()
    except UnicodeDecodeError:
        return None


def _checked(value: object, param: str, source: str) -> FoundSession:
    """``value`` as a session id, or the 400 that names where it came from (``param``)."""
    if not isinstance(value, str):
        raise InvalidRequest(
            f"The session id ({param}) must be a string.",
            param=param,
            code="invalid_session_id",
        )
    if len(value) > MAX_SESSION_ID:
        raise InvalidRequest(
            f"The session id ({param}) is {len(value)} characters long; "
            f"at most {MAX_SESSION_ID} are allowed.",
            param=param,
            code="invalid_session_id",
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidRequest(
            f"The session id ({param}) must not contain control characters.",
            param=param,
            code="invalid_session_id",
        )
    return FoundSession(value, source)
