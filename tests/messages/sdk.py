"""The official Anthropic SDK's client, pointed at a proxy under test."""

from __future__ import annotations

import anthropic

from tests.harness import ProxyServer


def sdk_client(
    proxy: ProxyServer, *, session: str = "s-msg", key: str = "sk-ant-client"
) -> anthropic.Anthropic:
    """No retries (a test sees the first answer), the session named by X-Session-Id."""
    return anthropic.Anthropic(
        base_url=proxy.url,
        api_key=key,
        default_headers={"X-Session-Id": session},
        max_retries=0,
        timeout=60,
    )
