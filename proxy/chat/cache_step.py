"""The chat pipeline's prompt-cache step: the stable prefix, and the hints sent upstream.

``ChatExchange.plan`` measures the stable prefix (see
:mod:`proxy.context.stable_prefix`); ``_send`` asks :func:`cache_hints` what to
add for the route's upstream (see :mod:`proxy.upstream.cache_hints`):

- an OpenAI-compatible upstream gets the session's ``prompt_cache_key``,
  unless the client sent one, the request has no session, or the upstream
  says ``cache: {prompt_cache_key: off}``;
- a Claude model behind litellm gets ``cache_control`` breakpoints at the
  end of the policy's stable prefix, unless ``cache: {breakpoints: off}``;
- a llama.cpp server with ``cache: {slots: N}`` gets the session's ``id_slot``
  (chat completions; unless the client sent one): llama.cpp keeps one prompt
  cache per slot, and a session that always lands in its own slot finds its
  prefix there instead of another session's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policies.types import Decision, Message
from proxy.config.model import UpstreamConfig
from proxy.context.stable_prefix import StablePrefixes, forwarded_keys
from proxy.store.base import SessionRef
from proxy.upstream.cache_hints import (
    is_anthropic,
    session_cache_key,
    session_slot,
    with_breakpoints,
)


@dataclass(frozen=True)
class CacheHints:
    """What the proxy added for the upstream's prompt cache (nothing, by default)."""

    # The prompt_cache_key added to the body (None: none added).
    prompt_cache_key: str | None = None
    # The messages with breakpoints, for a translating upstream (None: unchanged).
    messages: list[Mapping[str, Any]] | None = None
    # Where breakpoints were placed (indexes into the forwarded messages).
    breakpoints: tuple[int, ...] = field(default_factory=tuple)
    # The llama.cpp slot the session is pinned to (None: none sent).
    id_slot: int | None = None

    @property
    def sent(self) -> bool:
        return (
            self.prompt_cache_key is not None or bool(self.breakpoints) or self.id_slot is not None
        )

    def detail(self) -> dict[str, Any]:
        """For the request row: what was sent (the key itself is a hash; no secret)."""
        out: dict[str, Any] = {}
        if self.prompt_cache_key is not None:
            out["prompt_cache_key"] = self.prompt_cache_key
        if self.breakpoints:
            out["breakpoints"] = list(self.breakpoints)
        if self.id_slot is not None:
            out["id_slot"] = self.id_slot
        return out


NO_HINTS = CacheHints()


def cache_hints(
    config: UpstreamConfig,
    ref: SessionRef | None,
    body: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    *,
    slots: bool = False,
) -> CacheHints:
    """The hints ``config``'s upstream gets for this request (``slots``: a chat request,
    which a llama.cpp server may be asked to keep in the session's slot)."""
    if config.base_url is not None:
        if ref is None:
            return NO_HINTS
        slot = None
        if slots and config.cache.slots is not None and "id_slot" not in body:
            slot = session_slot(ref.tenant, ref.key, config.cache.slots)
        if config.cache.prompt_cache_key == "off" or "prompt_cache_key" in body:
            return NO_HINTS if slot is None else CacheHints(id_slot=slot)
        return CacheHints(prompt_cache_key=session_cache_key(ref.tenant, ref.key), id_slot=slot)
    if config.cache.breakpoints == "auto" and is_anthropic(config.litellm_model):
        marked, placed = with_breakpoints(messages, body.get("tools"))
        if placed:
            return CacheHints(messages=marked, breakpoints=tuple(placed))
    return NO_HINTS


def measure_stable_prefix(
    prefixes: StablePrefixes,
    ref: SessionRef | None,
    decision: Decision,
    conversation: Sequence[Message],
    hashes: Sequence[str] | None,
    *,
    remember: bool,
) -> int | None:
    """Leading forwarded messages equal to the session's previous request's (None: no session).

    ``remember``: a real request becomes the session's previous one; a preview does not.
    """
    if ref is None or hashes is None:
        return None
    return prefixes.measure(ref, forwarded_keys(decision, conversation, hashes), remember=remember)
