"""An OpenAI-compatible upstream over a pooled aiohttp client.

aiohttp is used rather than httpx because it costs a third of the CPU per
proxied request and stays flat under concurrency (see bench/overhead.py).
The upstream's bytes are relayed as they are: no decompression (we ask for
identity encoding), no re-serialisation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import aiohttp

from proxy.errors import UpstreamError, UpstreamTimeout
from proxy.upstream.base import UpstreamRequest

# Headers that describe one hop, not the message; never relayed.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "date",
        "server",
    }
)


# Dropped from ``headers`` (the proxy may re-encode), but right for a byte-for-byte relay.
ENTITY = frozenset({"content-length", "content-encoding"})


class AiohttpResponse:
    def __init__(self, response: aiohttp.ClientResponse, origin: str = "The upstream") -> None:
        self._response = response
        self._origin = origin
        self.status = response.status
        self.headers = [(k, v) for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP]
        # For a pass-through relay, which sends the upstream's bytes unchanged.
        self.entity_headers = [(k, v) for k, v in response.headers.items() if k.lower() in ENTITY]

    async def read(self) -> bytes:
        try:
            return await self._response.read()
        except TimeoutError as exc:
            raise UpstreamTimeout(f"{self._origin} did not finish its answer in time.") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(
                f"{self._origin}: the connection failed: {type(exc).__name__}"
            ) from exc
        finally:
            self._response.release()

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except TimeoutError as exc:
            raise UpstreamTimeout(f"{self._origin}: the stream stalled.") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"{self._origin}: the stream failed: {type(exc).__name__}") from exc

    async def close(self) -> None:
        # close(), not release(): a stream abandoned midway must not go back to the pool.
        if not self._response.closed:
            self._response.close()


class OpenAICompatUpstream:
    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float = 10.0,
        pool_size: int = 256,
        name: str | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        # Named in every error (logs and client), so an operator knows which one failed.
        host = urlsplit(self._base_url).netloc or self._base_url
        self.origin = f"Upstream {name!r} ({host})" if name else f"The upstream ({host})"
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout_s, sock_read=timeout_s
        )
        self._pool_size = pool_size
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._pool_size, keepalive_timeout=60),
                timeout=self._timeout,
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),
            )
        return self._session

    async def send(self, request: UpstreamRequest) -> AiohttpResponse:
        url = self._base_url + request.path + (f"?{request.query}" if request.query else "")
        headers = dict(request.headers)
        headers["Accept-Encoding"] = "identity"
        data = request.body if request.body_stream is None else request.body_stream
        try:
            response = await self._client().request(request.method, url, headers=headers, data=data)
        except TimeoutError as exc:
            raise UpstreamTimeout(f"{self.origin} did not answer in time.") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"Could not reach {self.origin}: {type(exc).__name__}") from exc
        return AiohttpResponse(response, self.origin)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
