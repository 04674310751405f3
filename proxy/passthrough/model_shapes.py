"""A model list entry in either dialect: OpenAI's (``object: model``) or Anthropic's
(``type: model``, with ``display_name``, ``created_at`` and the context window).

``GET /v1/models`` answers in Anthropic's shape when the request is an
Anthropic client's (it sends ``anthropic-version`` or ``x-api-key``), in
OpenAI's otherwise; each upstream's entries are converted to that shape,
whichever API listed them. An Anthropic entry says the model's context
window (``max_input_tokens``, ``max_tokens``) where litellm's model map knows it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from proxy.context.model_info import model_entry


def wants_anthropic(headers: Mapping[str, str]) -> bool:
    """Whether the request comes from an Anthropic client."""
    return "anthropic-version" in headers or "x-api-key" in headers


def anthropic_model(entry: Mapping[str, Any]) -> dict[str, Any]:
    """An entry as Anthropic's ``ModelInfo``."""
    model_id = str(entry.get("id"))
    created = entry.get("created_at")
    if not isinstance(created, str):
        stamp = entry.get("created")
        seconds = stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else 0
        created = datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out: dict[str, Any] = {
        "type": "model",
        "id": model_id,
        "display_name": str(entry.get("display_name") or model_id),
        "created_at": created,
        "lifecycle": entry.get("lifecycle") or "active",
    }
    info = model_entry(model_id) or {}
    for key in ("max_input_tokens", "max_tokens"):
        value = entry.get(key, info.get(key))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[key] = value
    return out


def openai_model(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """An entry as OpenAI's ``Model`` (OpenAI's own entries as they came)."""
    if entry.get("type") != "model":
        return entry
    created = entry.get("created_at")
    try:
        stamp = int(datetime.fromisoformat(str(created).replace("Z", "+00:00")).timestamp())
    except ValueError:
        stamp = 0
    return {"id": entry.get("id"), "object": "model", "created": stamp, "owned_by": "anthropic"}


def anthropic_list(models: list[dict[str, Any]]) -> dict[str, Any]:
    """Anthropic's list page: every model, one page."""
    return {
        "data": models,
        "has_more": False,
        "first_id": models[0]["id"] if models else None,
        "last_id": models[-1]["id"] if models else None,
    }
