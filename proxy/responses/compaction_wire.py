"""Compaction on the Responses wire: who answers it, what is asked, and the answer's shapes.

- :func:`compaction_mode`: a route's ``compaction`` resolved for its upstream
  (``auto``: OpenAI's own API answers it, the proxy answers for any other).
- :func:`asked`: what a ``/v1/responses`` body asks: a ``compaction_trigger``
  as its last input item, a ``context_management`` compaction threshold.
- :func:`response_object` and :func:`stream_events`: a compaction answered as
  a Response object, or as a well-formed stream of typed events
  (``response.created``, ``response.in_progress``, ``response.output_item.added``,
  ``response.output_item.done``, ``response.completed`` with usage), sequence
  numbered, as OpenAI's API streams one; Codex requires exactly one
  ``compaction`` output item before ``response.completed``.
- :class:`CompactionFirst`: an upstream's stream with the compaction item put
  first (a compaction past the threshold is done before the answer): its two
  events after ``response.in_progress``, every later ``output_index`` and
  ``sequence_number`` moved on, the terminal response's output led by it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson

from proxy.config.model import RouteConfig, UpstreamConfig
from proxy.context.compaction_item import TRIGGER
from proxy.errors import InvalidRequest

Mode = Literal["proxy", "upstream", "off"]
# A compaction entry without a compact_threshold: this share of the model's context window.
DEFAULT_SHARE = 0.8
OPENAI_HOST = "api.openai.com"


def compaction_mode(route: RouteConfig, upstream: UpstreamConfig) -> Mode:
    if route.compaction != "auto":
        return route.compaction
    host = urlsplit(upstream.base_url).hostname if upstream.base_url else None
    return "upstream" if host == OPENAI_HOST else "proxy"


def not_supported(param: str) -> InvalidRequest:
    """OpenAI's error shape, for a compaction on a route where it is off."""
    return InvalidRequest(
        "Compaction is not supported on this route (its compaction is off).",
        param=param,
        code="compaction_not_supported",
    )


@dataclass(frozen=True)
class Asked:
    trigger: bool = False
    # A context_management compaction entry, and its compact_threshold (tokens of
    # the input; None: the default, DEFAULT_SHARE of the model's context window).
    managed: bool = False
    threshold: int | None = None

    @property
    def any(self) -> bool:
        return self.trigger or self.managed


def asked(body: Mapping[str, Any]) -> Asked:
    """What compaction a ``/v1/responses`` body asks for (a 400 for a malformed ask)."""
    value = body.get("input")
    trigger = (
        isinstance(value, list)
        and bool(value)
        and isinstance(value[-1], dict)
        and value[-1].get("type") == TRIGGER
    )
    threshold: int | None = None
    management = body.get("context_management")
    managed = bool(management)
    if management is not None:
        if not isinstance(management, list):
            raise InvalidRequest(
                "'context_management' must be an array.", param="context_management"
            )
        for i, entry in enumerate(management):
            where = f"context_management[{i}]"
            if not isinstance(entry, dict) or entry.get("type") != "compaction":
                raise InvalidRequest(
                    f"{where} must be an object of type 'compaction'.", param=where
                )
            value = entry.get("compact_threshold")
            if value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidRequest(
                    f"{where}.compact_threshold must be a positive integer.",
                    param=f"{where}.compact_threshold",
                )
            threshold = value if threshold is None else min(threshold, value)
    return Asked(trigger, managed, threshold)


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(
    body: Mapping[str, Any],
    output: list[dict[str, Any]],
    used: dict[str, Any],
    previous_id: str | None,
) -> dict[str, Any]:
    """A completed Response object answering ``body`` with ``output``."""
    return {
        "id": f"resp_{os.urandom(16).hex()}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": previous_id,
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": body.get("store", True),
        "temperature": body.get("temperature"),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation", "disabled"),
        "usage": used,
        "metadata": body.get("metadata") or {},
    }


def _event(kind: str, sequence: int, **fields: Any) -> bytes:
    data = orjson.dumps({"type": kind, "sequence_number": sequence, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def _item_events(item: dict[str, Any], index: int, first: int) -> list[bytes]:
    return [
        _event("response.output_item.added", first, output_index=index, item=item),
        _event("response.output_item.done", first + 1, output_index=index, item=item),
    ]


def stream_events(response: dict[str, Any]) -> list[bytes]:
    """The events of a completed compaction response, in order."""
    opening = {k: v for k, v in response.items() if k != "usage"}
    opening.update(status="in_progress", output=[])
    events = [
        _event("response.created", 0, response=opening),
        _event("response.in_progress", 1, response=opening),
    ]
    for i, item in enumerate(response["output"]):
        events += _item_events(item, i, 2 + 2 * i)
    events.append(_event("response.completed", len(events), response=response))
    return events


class CompactionFirst:
    """An upstream's stream with the compaction item first (a LineRewrite, event by event)."""

    def __init__(self, item: dict[str, Any]) -> None:
        self.item = item
        self._pending = b""
        self._inserted = False

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        end = data.rfind(b"\n\n") + 2
        if end < 2:
            self._pending = data
            return b""
        self._pending = data[end:]
        return b"".join(self._event(e) for e in data[:end].split(b"\n\n") if e.strip())

    def flush(self) -> bytes:
        data, self._pending = self._pending, b""
        return self._event(data) if data.strip() else b""

    def _event(self, raw: bytes) -> bytes:
        lines = raw.split(b"\n")
        at = next((i for i, line in enumerate(lines) if line.startswith(b"data:")), None)
        event: Any = None
        if at is not None:
            try:
                event = orjson.loads(lines[at][5:])
            except orjson.JSONDecodeError:
                event = None
        if at is None or not isinstance(event, dict):
            return raw + b"\n\n"
        kind = event.get("type")
        before = b""
        if not self._inserted and kind not in ("response.created", "response.in_progress"):
            self._inserted = True
            sequence = event.get("sequence_number")
            first = sequence if isinstance(sequence, int) else 0
            before = b"".join(_item_events(self.item, 0, first))
        if self._inserted:
            event = self._moved(event)
            lines[at] = b"data: " + orjson.dumps(event)
        return before + b"\n".join(lines) + b"\n\n"

    def _moved(self, event: dict[str, Any]) -> dict[str, Any]:
        out = dict(event)
        if isinstance(out.get("sequence_number"), int):
            out["sequence_number"] += 2
        if isinstance(out.get("output_index"), int):
            out["output_index"] += 1
        response = out.get("response")
        if isinstance(response, dict) and isinstance(response.get("output"), list):
            out["response"] = {**response, "output": [self.item, *response["output"]]}
        return out


def with_item_first(content: bytes, item: dict[str, Any]) -> bytes:
    """A whole Response object's bytes with ``item`` leading its output."""
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content
    if not isinstance(data, dict) or not isinstance(data.get("output"), list):
        return content
    data["output"] = [item, *data["output"]]
    return orjson.dumps(data)
