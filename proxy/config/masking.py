"""A policy's ``mask_tool_outputs`` block (see policies.mask), read with errors naming the path."""

from __future__ import annotations

from policies.types import MaskSpec
from proxy.config.node import Node


def mask_spec(policy: Node) -> MaskSpec | None:
    """``mask_tool_outputs: {after_turns, min_tokens, step_tokens}``; None when absent.

    ``true`` takes every default. ``min_tokens`` is at least 32 (a placeholder
    costs about 20 tokens); ``step_tokens`` 0 masks each result as soon as it
    is old enough (no steps: the prompt cache breaks every turn).
    """
    raw = policy.raw("mask_tool_outputs")
    if raw is None or raw is False:
        return None
    d = MaskSpec()
    node = Node(
        policy.at("mask_tool_outputs"),
        {} if raw is True else raw,
        {"after_turns", "min_tokens", "step_tokens"},
    )
    return MaskSpec(
        after_turns=node.integer("after_turns", d.after_turns, minimum=1) or d.after_turns,
        min_tokens=node.integer("min_tokens", d.min_tokens, minimum=32) or d.min_tokens,
        step_tokens=_integer(node, "step_tokens", d.step_tokens),
    )


def _integer(node: Node, key: str, default: int) -> int:
    value = node.integer(key, default, minimum=0)
    return default if value is None else value
