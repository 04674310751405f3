"""Client keys (``server.client_keys``): who may use the proxy, and as which tenant.

With client keys configured, every ``/v1/...`` call and ``/metrics`` must
carry one (``Authorization: Bearer <key>``, or ``x-api-key: <key>`` as
Anthropic's clients send it), checked before routing with a
constant-time comparison of its SHA-256 against every configured hash;
anything else is a 401 in OpenAI's shape. The key's *name* becomes the
request's tenant, and the client's ``Authorization`` (and ``x-api-key``) header is consumed here:
it never reaches an upstream (which uses its own ``api_key``). ``/healthz``,
``/readyz`` and ``/admin`` (which has its own key) are not covered.

Without client keys the tenant is a hash of the client's own API key, and a
request without one belongs to ``session.anonymous_tenant`` if configured,
else to nobody: it is proxied, and nothing of it is stored.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from proxy.config.model import ClientKey
from proxy.errors import Unauthorized, door_of
from proxy.http.sessions import bearer_token, tenant_of

# Where the guard leaves the authenticated key's name, in the ASGI scope.
TENANT_SCOPE_KEY = "ctxproxy.tenant"


def match_key(keys: tuple[ClientKey, ...], token: str | None) -> str | None:
    """The name of the key ``token`` is, or None; every hash is compared, in constant time."""
    if not token:
        return None
    digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
    found: str | None = None
    for key in keys:
        if hmac.compare_digest(digest, key.sha256):
            found = key.name
    return found


def request_tenant(
    scope: Mapping[str, object], headers: Mapping[str, str], anonymous: str | None
) -> str | None:
    """The request's tenant; None when it has no key and no anonymous tenant is configured."""
    named = scope.get(TENANT_SCOPE_KEY)
    if isinstance(named, str):
        return named
    token = bearer_token(headers)
    if token:
        return tenant_of(token)
    return anonymous


# The client's key headers: consumed by the guard, never forwarded upstream.
_CONSUMED = frozenset({b"authorization", b"x-api-key"})


def _guarded(path: str) -> bool:
    return path.startswith("/v1/") or path in ("/v1", "/metrics")


class ClientKeyGuard:
    def __init__(self, app: ASGIApp, keys: tuple[ClientKey, ...]) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.keys or not _guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        raw = scope["headers"]
        value = next((v for k, v in raw if k == b"authorization"), b"").decode("latin-1")
        # Anthropic's clients send their key as x-api-key (Claude Code, the SDKs).
        api_key = next((v for k, v in raw if k == b"x-api-key"), b"").decode("latin-1")
        token = bearer_token({"authorization": value}) if value else api_key or None
        name = match_key(self.keys, token)
        if name is None:
            error = Unauthorized("Invalid or missing client API key.")
            body = error.door_bytes(door_of(scope["path"]))
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        scope = dict(scope)
        scope["headers"] = [(k, v) for k, v in raw if k not in _CONSUMED]
        scope[TENANT_SCOPE_KEY] = name
        await self.app(scope, receive, send)
