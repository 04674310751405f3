"""The Upstream protocol.

An upstream takes a request already rewritten by the policy and answers with
a status, headers and body bytes, which may arrive as a stream. For an
OpenAI-compatible upstream these are the upstream's own bytes; a translating
upstream (litellm) produces OpenAI-shaped bytes itself, so the rest of the
proxy never knows the difference.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class UpstreamRequest:
    method: str
    # Path below the upstream's base URL, e.g. "/chat/completions".
    path: str
    # Headers to send (already filtered; Authorization set as configured).
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    # The parsed body, for upstreams that translate instead of forwarding bytes.
    json: dict[str, Any] | None = None
    stream: bool = False
    query: str = ""
    # A body relayed as it arrives (pass-through uploads), instead of ``body``.
    body_stream: AsyncIterable[bytes] | None = None


class UpstreamResponse(Protocol):
    status: int
    # Response headers worth relaying (hop-by-hop ones already removed).
    headers: list[tuple[str, str]]

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def iter_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives, chunk by chunk."""
        ...

    async def close(self) -> None:
        """Release the connection; safe to call twice."""
        ...


class Upstream(Protocol):
    async def send(self, request: UpstreamRequest) -> UpstreamResponse:
        """Send a request.

        Raises ``proxy.errors.UpstreamError`` when the upstream cannot be
        reached and ``proxy.errors.UpstreamTimeout`` when it does not answer in
        time. An HTTP error status is not an exception: it is relayed.
        """
        ...

    async def close(self) -> None: ...
