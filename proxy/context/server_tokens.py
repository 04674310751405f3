"""Tokens of a text as a local server counts them, for calibration when it reports no usage.

llama-cpp-python streams no ``usage`` (not even with
``stream_options.include_usage``), so a client that only streams would never
calibrate. After such a stream, the answer's text is counted by the server's
own tokenizer and compared with the local count of the same text: one more
sample for :class:`~proxy.context.calibration.Calibration`, weighted by its
size as every sample is. In the background, after the answer was relayed.

The servers' tokenize endpoints, tried in order, the one that answers
remembered per upstream (and an upstream with none is not asked again):
llama-cpp-python ``POST /extras/tokenize/count``; llama.cpp and vLLM
``POST /tokenize``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from proxy.config.model import UpstreamConfig
from proxy.context.windows import server_root

ASK_TIMEOUT_S = 5.0
# Shorter answers say little about the tokenizer (a sample is weighted by size anyway).
MIN_CHARS = 40


def _count(data: Any) -> int | None:
    """``{"count": n}`` (llama-cpp-python, vLLM) or ``{"tokens": [...]}`` (llama.cpp)."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool):
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


Ask = tuple[str, Callable[[str, str], dict[str, Any]]]
# (path at the server's root, the body for a text and a model name).
ASKS: tuple[Ask, ...] = (
    ("/extras/tokenize/count", lambda text, model: {"input": text, "model": model}),
    ("/tokenize", lambda text, model: {"content": text, "prompt": text, "model": model}),
)


class ServerTokens:
    """Counts texts with an upstream's own tokenizer, where it has an endpoint for it."""

    def __init__(self) -> None:
        # Per upstream: the index in ASKS that answered, or -1 for none.
        self._works: dict[str, int] = {}

    def may_count(self, upstream: str) -> bool:
        return self._works.get(upstream, 0) >= 0

    async def count(self, config: UpstreamConfig, model: str, text: str) -> int | None:
        """The server's token count of ``text``; None when it has no way to say."""
        if config.base_url is None or len(text) < MIN_CHARS or not self.may_count(config.name):
            return None
        known = self._works.get(config.name)
        order = [known] if known is not None else list(range(len(ASKS)))
        root = server_root(config.base_url)
        headers = dict(config.headers)
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"
        timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            for i in order:
                path, body = ASKS[i]
                try:
                    async with http.post(root + path, json=body(text, model)) as response:
                        said = _count(orjson.loads(await response.read()))
                        if response.status != 200:
                            said = None
                except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                    said = None
                if said is not None and said > 0:
                    self._works[config.name] = i
                    return said
        if known is None:
            self._works[config.name] = -1  # none of them: not asked again
        return None
