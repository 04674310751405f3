"""The context window of a model behind an upstream: config, the model map, else the server.

``context_fraction`` budgets need the window of the model a request reaches.
Hosted models are in litellm's model map (:mod:`proxy.context.model_info`); a
local model is not, and its window is whatever its server was started with.
In order, the first that knows wins:

1. the upstream's config: ``context_windows[model]``, then ``context_window``;
2. the model map, by the model's name;
3. what the server says, asked once per (upstream, model) and remembered:
   llama.cpp's ``GET /props`` (``n_ctx``, per slot), vLLM's ``GET /v1/models``
   (``max_model_len``), Ollama's ``POST /api/show`` (``num_ctx`` in its
   parameters). A server that says nothing (llama-cpp-python, a hosted API)
   is asked again only after ``RETRY_S``.

Lookups are synchronous dict reads (the rewriter runs on the hot path); the
asking is :meth:`ContextWindows.learn`, awaited before a policy that needs a
window runs, and a no-op once the answer is known.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import orjson

from proxy.config.model import UpstreamConfig
from proxy.context.model_info import context_window
from proxy.telemetry.logging import get_logger

log = get_logger()

# A server's answer is awaited this long (it is on a request's path, once).
ASK_TIMEOUT_S = 2.0
# A server that said nothing is asked again after this long (it may have restarted).
RETRY_S = 300.0
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)\s*$", re.MULTILINE)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def llama_cpp_window(props: Any) -> int | None:
    """llama.cpp ``/props``: the per-slot ``n_ctx`` of its generation settings."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict) and _positive(settings.get("n_ctx")):
        return _positive(settings.get("n_ctx"))
    return _positive(props.get("n_ctx"))


def vllm_window(models: Any, model: str) -> int | None:
    """vLLM ``/v1/models``: ``max_model_len`` of the model (or of the only one served)."""
    data = models.get("data") if isinstance(models, dict) else None
    if not isinstance(data, list):
        return None
    entries = [m for m in data if isinstance(m, dict)]
    named = [m for m in entries if m.get("id") == model] or (entries if len(entries) == 1 else [])
    return _positive(named[0].get("max_model_len")) if named else None


def ollama_window(show: Any) -> int | None:
    """Ollama ``/api/show``: ``num_ctx`` in the model's parameters."""
    params = show.get("parameters") if isinstance(show, dict) else None
    found = _NUM_CTX.search(params) if isinstance(params, str) else None
    return int(found.group(1)) if found else None


def server_root(base_url: str) -> str:
    """The server's own root: the base URL without its ``/v1``."""
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


class ContextWindows:
    def __init__(self, upstreams: Mapping[str, UpstreamConfig] | None = None) -> None:
        # Replaced on reload; what servers said is kept.
        self.upstreams: Mapping[str, UpstreamConfig] = upstreams or {}
        self._said: dict[tuple[str, str], int] = {}
        self._silent: dict[tuple[str, str], float] = {}
        self._asking: dict[tuple[str, str], asyncio.Task[int | None]] = {}

    def window(self, model: str, upstream: str | None = None) -> int | None:
        """The window, when config, the model map or the server said it; else None."""
        config = self.upstreams.get(upstream) if upstream is not None else None
        if config is not None:
            configured = config.context_windows.get(model) or config.context_window
            if configured is not None:
                return configured
        known = context_window(model)
        if known is not None or upstream is None:
            return known
        return self._said.get((upstream, model))

    def source(self, model: str, upstream: str | None = None) -> str | None:
        """Where :meth:`window` got it: ``config``, ``model_map``, ``server`` (or None)."""
        config = self.upstreams.get(upstream) if upstream is not None else None
        if config is not None and (config.context_windows.get(model) or config.context_window):
            return "config"
        if context_window(model) is not None:
            return "model_map"
        return "server" if upstream is not None and (upstream, model) in self._said else None

    async def learn(self, upstream: str, model: str) -> None:
        """Ask the server for the window, unless it is known or was asked lately."""
        key = (upstream, model)
        if key in self._said or self.window(model, upstream) is not None:
            return
        silent = self._silent.get(key)
        if silent is not None and time.monotonic() - silent < RETRY_S:
            return
        config = self.upstreams.get(upstream)
        if config is None or config.base_url is None:
            return
        task = self._asking.get(key)
        if task is None:
            task = asyncio.ensure_future(self._ask(config, model))
            self._asking[key] = task
        try:
            said = await asyncio.shield(task)
        finally:
            self._asking.pop(key, None)
        if said is None:
            self._silent[key] = time.monotonic()
        else:
            self._said[key] = said
            log.info("context_window_learned", upstream=upstream, model=model, tokens=said)

    async def _ask(self, config: UpstreamConfig, model: str) -> int | None:
        assert config.base_url is not None
        root = server_root(config.base_url)
        headers = dict(config.headers)
        if config.api_key:
            headers["authorization"] = f"Bearer {config.api_key}"
        timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
        asks: tuple[tuple[Callable[[Any], int | None], str, str, Any], ...] = (
            (llama_cpp_window, "GET", f"{root}/props", None),
            (lambda data: vllm_window(data, model), "GET", f"{config.base_url}/models", None),
            (ollama_window, "POST", f"{root}/api/show", {"model": model}),
        )
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as http:
            for read, method, url, body in asks:
                try:
                    async with http.request(method, url, json=body) as response:
                        if response.status != 200:
                            continue
                        said = read(orjson.loads(await response.read()))
                except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
                    continue
                if said is not None:
                    return said
        return None


async def listed_models(config: UpstreamConfig) -> list[str] | None:
    """The ids an OpenAI-compatible server lists at ``/models`` (None: it did not say)."""
    if config.base_url is None:
        return None
    headers = dict(config.headers)
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout, headers=headers) as http,
            http.get(f"{config.base_url}/models") as response,
        ):
            if response.status != 200:
                return None
            data = orjson.loads(await response.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return None
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None
    return [str(m["id"]) for m in entries if isinstance(m, dict) and isinstance(m.get("id"), str)]
