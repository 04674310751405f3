"""What the upstream says its prompt cache did, read from its own ``usage`` object.

The numbers are the provider's, never an estimate:

- chat completions: ``usage.prompt_tokens_details.cached_tokens``;
- Responses: ``usage.input_tokens_details.cached_tokens``;
- Anthropic through litellm: ``cache_read_input_tokens`` (read) and
  ``cache_creation_input_tokens`` (written), which litellm copies to the top
  level of the OpenAI-shaped usage (and mirrors as
  ``prompt_tokens_details.cached_tokens`` / ``cache_creation_tokens``).

``prompt_tokens`` is the upstream's own prompt size (``input_tokens`` for
Responses): the denominator of a cache-hit ratio. A field the upstream did not
send stays None, so "no cache reported" and "nothing cached" differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CacheUsage:
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    # Tokens written to the cache (Anthropic's cache creation); None elsewhere.
    cache_write_tokens: int | None = None


NO_USAGE = CacheUsage()


def _int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _details(usage: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    details = usage.get(key)
    return details if isinstance(details, Mapping) else {}


def cache_usage(usage: Mapping[str, Any] | None) -> CacheUsage:
    """The cache figures in a chat or Responses ``usage`` object (None: none reported)."""
    if not isinstance(usage, Mapping):
        return NO_USAGE
    prompt = _int(usage.get("prompt_tokens"))
    if prompt is None:
        prompt = _int(usage.get("input_tokens"))
    chat = _details(usage, "prompt_tokens_details")
    responses = _details(usage, "input_tokens_details")
    cached = _int(chat.get("cached_tokens"))
    if cached is None:
        cached = _int(responses.get("cached_tokens"))
    read = _int(usage.get("cache_read_input_tokens"))
    if read is not None and (cached is None or read > cached):
        cached = read
    written = _int(usage.get("cache_creation_input_tokens"))
    if written is None:
        written = _int(chat.get("cache_creation_tokens"))
    if written is None:
        written = _int(chat.get("cache_write_tokens"))
    return CacheUsage(prompt_tokens=prompt, cached_tokens=cached, cache_write_tokens=written)


def hit_ratio(cached: int, prompt: int) -> float | None:
    """cached / prompt tokens, rounded; None when nothing was reported."""
    return round(cached / prompt, 4) if prompt > 0 else None


# OpenAI's automatic caching: prompts from 1,024 tokens, cached in 128-token steps.
CACHE_MINIMUM = 1024
CACHE_STEP = 128


def estimate_cached(prefix_tokens: int) -> int:
    """What an OpenAI-style cache would serve of a prefix it has seen: the preview's estimate."""
    if prefix_tokens < CACHE_MINIMUM:
        return 0
    return CACHE_MINIMUM + (prefix_tokens - CACHE_MINIMUM) // CACHE_STEP * CACHE_STEP
