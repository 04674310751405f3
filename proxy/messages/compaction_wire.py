"""Anthropic's compaction on the Messages wire: who answers it, what is asked, the block's shapes.

- :func:`compaction_mode`: a route's ``compaction`` resolved for its upstream
  (``auto``: an Anthropic upstream answers it, the proxy answers for any other).
- :func:`summarize_asked`: ``compaction: {"type": "summarize"}`` (on demand).
  Threshold compaction (``compact_20260112``) is a context edit
  (proxy/messages/context_edits.py).
- :func:`compaction_block`: the proxy's ``compaction`` block. Its ``content``
  is the summary as text (what a client shows); its ``encrypted_content`` the
  versioned, self-contained payload of proxy/context/compaction_item.py, the
  one the Responses door's item carries, so any instance expands it.
- :func:`expand_blocks`: a request's messages with the newest compaction block
  read as Anthropic reads it (everything before it dropped) and made into a
  user message holding the summary, which every model reads.
- :func:`message_object`, :func:`message_events`: a compaction answered alone
  (``stop_reason: "compaction"``), whole or as Anthropic's events.
- :func:`with_block_first` and :class:`BlockFirst`: an upstream's answer with
  the block before its content (threshold compaction, as Anthropic answers).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from policies.facts import facts_from_json
from policies.transcript import summary_content
from proxy.config.model import RouteConfig, UpstreamConfig
from proxy.context.compaction_item import PREFIX, CompactionPayload, decode, encode
from proxy.errors import InvalidRequest
from proxy.upstream.base import UpstreamResponse

Mode = Literal["proxy", "upstream", "off"]


def compaction_mode(route: RouteConfig, upstream: UpstreamConfig) -> Mode:
    if route.compaction != "auto":
        return route.compaction
    return "upstream" if upstream.anthropic else "proxy"


def not_supported(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param}: compaction is not supported on this route (its compaction is off).",
        param=param,
        code="compaction_not_supported",
    )


def summarize_asked(body: Mapping[str, Any]) -> bool:
    """Whether the body asks for a compaction now (a 400 for a malformed ask)."""
    value = body.get("compaction")
    if value is None:
        return False
    if not isinstance(value, Mapping) or value.get("type") != "summarize":
        raise InvalidRequest(
            "compaction: must be {'type': 'summarize'}.", param="compaction", code="invalid_value"
        )
    instructions = value.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidRequest(
            "compaction.instructions: must be a string.",
            param="compaction.instructions",
            code="invalid_value",
        )
    return True


def summary_text(payload: CompactionPayload) -> str:
    """The summary as the text a model reads (header, summary, pinned facts)."""
    return summary_content(payload.summary, facts_from_json(list(payload.facts)))


def compaction_block(payload: CompactionPayload) -> dict[str, Any]:
    return {"type": "compaction", "content": payload.summary, "encrypted_content": encode(payload)}


def is_own_block(block: Mapping[str, Any]) -> bool:
    content = block.get("encrypted_content")
    return (
        block.get("type") == "compaction"
        and isinstance(content, str)
        and content.startswith(PREFIX)
    )


@dataclass(frozen=True)
class ExpandedBlocks:
    """The request's messages as forwarded, and what expansion did."""

    messages: list[dict[str, Any]]
    # The newest compaction block's payload (the proxy's own), if one was expanded.
    payload: CompactionPayload | None = None
    # Compaction blocks read (the proxy's, or a foreign one's summary text), messages
    # they dropped (what came before), blocks taken out (foreign or failed ones).
    expanded: int = 0
    dropped: int = 0
    removed: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.expanded or self.removed)

    def detail(self) -> dict[str, int]:
        shown = {"expanded": self.expanded, "folded": self.dropped, "foreign_dropped": self.removed}
        return {k: v for k, v in shown.items() if v}


def _newest(messages: Sequence[Mapping[str, Any]], readable: bool) -> tuple[int, int] | None:
    """Where the newest compaction block the proxy reads is (message, block)."""
    for i in range(len(messages) - 1, -1, -1):
        content = messages[i].get("content")
        if not isinstance(content, list):
            continue
        for j in range(len(content) - 1, -1, -1):
            block = content[j]
            if block.get("type") != "compaction":
                continue
            if is_own_block(block) or (readable and isinstance(block.get("content"), str)):
                return i, j
    return None


def expand_blocks(messages: Sequence[dict[str, Any]], *, keep_foreign: bool) -> ExpandedBlocks:
    """``messages`` with the newest compaction block read as Anthropic reads it.

    What came before the block is dropped (the block stands for it); the block
    becomes a user message with its summary, the blocks after it in its message
    stay (a threshold compaction's answer). The proxy's own block is always
    expanded (no upstream can read it); with ``keep_foreign`` (an Anthropic
    upstream answers compaction) the other blocks stay as they came, else a
    foreign block's summary text is read like the proxy's own, and blocks that
    carry none (a failed compaction: a no-op) are taken out.
    """
    at = _newest(messages, readable=not keep_foreign)
    payload: CompactionPayload | None = None
    out = list(messages)
    expanded = dropped = 0
    if at is not None:
        i, j = at
        content = messages[i]["content"]
        block = content[j]
        if is_own_block(block):
            payload = decode(str(block["encrypted_content"]), f"messages.{i}.content.{j}")
            text = summary_text(payload)
        else:
            text = str(block["content"])
        rest = list(content[j + 1 :])
        head = [{"role": "user", "content": [{"type": "text", "text": text}]}]
        if rest:
            head.append({**messages[i], "content": rest})
        out = [*head, *messages[i + 1 :]]
        expanded, dropped = 1, i
    removed = 0
    if not keep_foreign:
        kept: list[dict[str, Any]] = []
        for message in out:
            content = message.get("content")
            if isinstance(content, list) and any(b.get("type") == "compaction" for b in content):
                blocks = [b for b in content if b.get("type") != "compaction"]
                removed += len(content) - len(blocks)
                if not blocks:
                    continue
                message = {**message, "content": blocks}
            kept.append(message)
        out = kept
    return ExpandedBlocks(out, payload, expanded, dropped, removed)


def message_object(
    model: str, content: list[dict[str, Any]], usage: dict[str, int]
) -> dict[str, Any]:
    """A whole ``message`` answering a compaction alone (nothing sampled after the block)."""
    return {
        "id": f"msg_{os.urandom(12).hex()}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": "compaction",
        "stop_sequence": None,
        "usage": usage,
    }


def _event(kind: str, data: Mapping[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def block_events(block: Mapping[str, Any], index: int) -> list[bytes]:
    """A compaction block's three events (its content in one ``compaction_delta``)."""
    start = {"type": "compaction", "content": None, "encrypted_content": None}
    delta = {
        "type": "compaction_delta",
        "content": block.get("content"),
        "encrypted_content": block.get("encrypted_content"),
    }
    return [
        _event(
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": start},
        ),
        _event(
            "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}
        ),
        _event("content_block_stop", {"type": "content_block_stop", "index": index}),
    ]


def message_events(message: Mapping[str, Any]) -> list[bytes]:
    """``message`` (one compaction block) as Anthropic streams it."""
    usage = dict(message["usage"])
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": usage,
    }
    return [
        _event("message_start", {"type": "message_start", "message": start}),
        *block_events(message["content"][0], 0),
        _event("message_delta", delta),
        _event("message_stop", {"type": "message_stop"}),
    ]


def with_block_first(content: bytes, block: dict[str, Any]) -> bytes:
    """A whole answer with ``block`` before its content (as it came when it is not a message)."""
    try:
        message = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if not isinstance(message, dict) or not isinstance(message.get("content"), list):
        return content
    return orjson.dumps({**message, "content": [block, *message["content"]]})


class BlockFirst:
    """An upstream's event stream with the compaction block's events after
    ``message_start``, every later block's ``index`` moved on by one."""

    def __init__(self, response: UpstreamResponse, block: dict[str, Any]) -> None:
        self.status = response.status
        self.headers = response.headers
        self._response = response
        self._block = block
        self._buffer = b""
        self._placed = False

    async def read(self) -> bytes:
        return with_block_first(await self._response.read(), self._block)

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._response.iter_chunks():
            out = self._feed(chunk)
            if out:
                yield out
        if self._buffer:
            yield self._buffer
            self._buffer = b""

    def _feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        out: list[bytes] = []
        while b"\n\n" in self._buffer:
            event, _, self._buffer = self._buffer.partition(b"\n\n")
            out.append(self._event(event + b"\n\n"))
        return b"".join(out)

    def _event(self, raw: bytes) -> bytes:
        data = next(
            (line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")), None
        )
        try:
            event = orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            return raw
        if not isinstance(event, dict):
            return raw
        if event.get("type") == "message_start" and not self._placed:
            self._placed = True
            return raw + b"".join(block_events(self._block, 0))
        if isinstance(event.get("index"), int) and str(event.get("type", "")).startswith(
            "content_block"
        ):
            kind = str(event["type"])
            return _event(kind, {**event, "index": event["index"] + 1})
        return raw

    async def close(self) -> None:
        await self._response.close()
