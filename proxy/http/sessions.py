"""Who is talking: the session id, the tenant, message identity, per-session locks."""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import orjson

from proxy.config.model import SessionConfig
from proxy.http.session_lookup import find_session
from proxy.store.base import SessionRef

ANONYMOUS_TENANT = "anonymous"


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The client's API key: ``Authorization`` (Bearer or bare), else Anthropic's ``x-api-key``."""
    value = headers.get("authorization")
    if not value:
        return headers.get("x-api-key") or None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else value.strip()


def tenant_of(api_key: str | None) -> str:
    """A stable, non-reversible tenant id: the same key always maps to the same tenant."""
    if not api_key:
        return ANONYMOUS_TENANT
    return _tenant_hash(api_key)


# Cached per key (issue 16: a client sends the same key on every request). Held
# in this process only, as the key already is while its request runs; never logged.
@functools.lru_cache(maxsize=4096)
def _tenant_hash(api_key: str) -> str:
    return hashlib.sha256(b"ctxproxy-tenant:" + api_key.encode()).hexdigest()[:24]


def session_key(
    config: SessionConfig, headers: Mapping[str, str], body: Mapping[str, Any]
) -> str | None:
    """The session id (proxy/http/session_lookup.py: the header, fallbacks, known agents)."""
    return find_session(config, headers, body).key


# Kept as they are in the X-Session-Id response header: printable ASCII but '%'.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) != "%")


def header_value(key: str) -> str:
    """A session id as the response header carries it: percent-encoded UTF-8 where needed.

    Header values are Latin-1 bytes; an id from the body (``user``,
    ``metadata.session_id``) may be any Unicode. Printable ASCII other than
    ``%`` is kept as is, everything else is percent-encoded, so
    ``urllib.parse.unquote`` of the header always gives back the id.
    """
    if key.isascii() and key.isprintable() and "%" not in key:
        return key
    return quote(key, safe=_HEADER_SAFE)


def session_ref(tenant: str, key: str | None) -> SessionRef | None:
    return SessionRef(tenant=tenant, key=key) if key else None


_IDENTITY_KEYS = (
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "function_call",
    "refusal",
)


def _canonical(message: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a message that makes it *this* message.

    Clients resend the assistant reply as their SDK shaped it (with
    ``refusal: null``, ``annotations: []``, ``audio: null``...), so identity
    ignores empty values and fields that only decorate a reply.
    """
    out: dict[str, Any] = {}
    for key in _IDENTITY_KEYS:
        value = message.get(key)
        if value is None or value == "" or value == []:
            continue
        if key == "tool_calls" and isinstance(value, list):
            value = [
                {
                    "id": c.get("id"),
                    "type": c.get("type", "function"),
                    "function": {
                        "name": (c.get("function") or {}).get("name"),
                        "arguments": (c.get("function") or {}).get("arguments"),
                    },
                }
                if isinstance(c, Mapping)
                else c
                for c in value
            ]
        out[key] = value
    return out


def content_hash(message: Mapping[str, Any]) -> str:
    if len(message) == 2:
        # The usual message, {"role": ..., "content": "..."}: its canonical form is its
        # two fields in sorted order, built directly (a client-held miss hashes every
        # message of the history; the general path took ~14% more).
        role = message.get("role")
        content = message.get("content")
        if type(role) is str and type(content) is str and role and content:
            data = orjson.dumps({"content": content, "role": role})
            return hashlib.blake2b(data, digest_size=16).hexdigest()
    data = orjson.dumps(_canonical(message), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


class SessionLocks:
    """One asyncio lock per session, forgotten when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[SessionRef, tuple[asyncio.Lock, int]] = {}

    async def acquire(self, ref: SessionRef) -> None:
        lock, users = self._locks.get(ref, (asyncio.Lock(), 0))
        self._locks[ref] = (lock, users + 1)
        try:
            await lock.acquire()
        except BaseException:
            self._forget(ref)
            raise

    def release(self, ref: SessionRef) -> None:
        lock, _ = self._locks[ref]
        lock.release()
        self._forget(ref)

    def _forget(self, ref: SessionRef) -> None:
        lock, users = self._locks[ref]
        if users <= 1:
            del self._locks[ref]
        else:
            self._locks[ref] = (lock, users - 1)
