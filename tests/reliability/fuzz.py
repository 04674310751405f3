"""The fuzz of every endpoint: how many bodies, and what a run checks after each one."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import httpx

# Per endpoint in `make test` (scaled by its share: endpoints.py); `make reliability` sets
# RELIABILITY_BODIES=10000.
BODIES_PER_ENDPOINT = int(os.environ.get("RELIABILITY_BODIES", "1000"))
OWN_500 = "The proxy failed to handle this request."


@dataclass
class Tally:
    bodies: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    relayed_5xx: int = 0
    failures: list[str] = field(default_factory=list)

    def check(
        self,
        response: httpx.Response,
        upstream_calls_before: int,
        upstream_calls_after: int,
        what: str,
        door: str = "openai",
    ) -> None:
        """No 5xx of our own; every 4xx in its door's shape (OpenAI's, or Anthropic's)."""
        self.bodies += 1
        status = response.status_code
        self.by_status[status] = self.by_status.get(status, 0) + 1
        if status >= 500:
            relayed = upstream_calls_after > upstream_calls_before and OWN_500 not in response.text
            if relayed:
                self.relayed_5xx += 1
            else:
                self.failures.append(f"{status} {response.text[:200]} for {what[:300]}")
        elif status >= 400 and upstream_calls_after == upstream_calls_before:
            # The proxy's own 4xx (a relayed one is the upstream's bytes, unchanged).
            problem = (
                anthropic_error_problem(response)
                if door == "anthropic"
                else openai_error_problem(response)
            )
            if problem:
                self.failures.append(f"{status} {problem} for {what[:300]}")


def openai_error_problem(response: httpx.Response) -> str | None:
    try:
        body: Any = response.json()
    except ValueError:
        return f"not JSON: {response.text[:100]!r}"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return f"not an error object: {response.text[:100]!r}"
    error = body["error"]
    if set(error) != {"message", "type", "param", "code"}:
        return f"error keys {sorted(error)}"
    if not isinstance(error["message"], str) or not isinstance(error["type"], str):
        return "message/type not strings"
    if len(response.content) > 2000:
        return f"error body of {len(response.content)} bytes (an echo not capped?)"
    return None


def anthropic_error_problem(response: httpx.Response) -> str | None:
    """What is wrong with an error body of the Anthropic door (None: its documented shape,
    ``{"type": "error", "error": {"type": ..., "message": ...}}``)."""
    try:
        body: Any = response.json()
    except ValueError:
        return f"not JSON: {response.text[:100]!r}"
    if not isinstance(body, dict) or body.get("type") != "error":
        return f"not an Anthropic error object: {response.text[:100]!r}"
    error = body.get("error")
    if not isinstance(error, dict):
        return "error is not an object"
    if not isinstance(error.get("type"), str) or not isinstance(error.get("message"), str):
        return "type/message not strings"
    if len(response.content) > 2000:
        return f"error body of {len(response.content)} bytes (an echo not capped?)"
    return None
