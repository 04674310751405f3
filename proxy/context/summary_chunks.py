"""A summary made in chunks when its range does not fit the summarizer's window.

The window is the summarizer spec's ``context_window``, else the one the
model's known information gives (proxy/context/model_info.py); unknown, or
the offline extractive summarizer (it reads any length), the range is one
call as always. Past the window, the range is split (:func:`policies.chunks.chunks`)
so that each call's instructions, partial summary, transcript and answer fit,
and each call extends the partial summary the previous one wrote; the last
one's text is the summary, the calls' usage summed. More calls than
:data:`policies.chunks.MAX_CALLS` would take: ``too_long`` (the caller's fallback
answers). The caller's timeout covers all the calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies.chunks import chunks
from policies.transcript import transcript
from policies.types import CountFn, Message, SummarizerSpec
from proxy.context.model_info import context_window
from proxy.context.summarizer import (
    DEFAULT_PROMPT,
    EXTRACTIVE_MODEL,
    Summarizer,
    SummaryFailed,
    SummaryOutput,
    SummaryRequest,
    request_messages,
)

# Tokens left free in each call besides what is counted (the chat framing, counting error).
MARGIN = 256


def window_of(spec: SummarizerSpec, summarizer: Summarizer) -> int | None:
    """The summarizer's input window in tokens (None: unknown, or no limit)."""
    model = summarizer.model
    if model is None or model == EXTRACTIVE_MODEL:
        return None
    return spec.context_window or context_window(model)


async def summarize_range(
    summarizer: Summarizer,
    spec: SummarizerSpec,
    previous: str | None,
    shown: Sequence[Message],
    source: Sequence[int],
    max_tokens: int,
    count: CountFn,
) -> SummaryOutput:
    """The summary of ``shown`` at ``source`` extending ``previous``: one call when it
    fits the window, chunks when it does not (see the module docstring)."""
    whole = SummaryRequest(previous, transcript(shown, source), max_tokens)
    window = window_of(spec, summarizer)
    if window is None:
        return await summarizer.summarize(whole)
    prompt = spec.prompt or DEFAULT_PROMPT
    asked = sum(map(count, request_messages(prompt, whole)))
    if asked + max_tokens + MARGIN <= window:
        return await summarizer.summarize(whole)
    # Each call: the instructions, a partial summary of up to max_tokens (or the previous
    # summary, when longer), the chunk's transcript and the answer.
    fixed = sum(map(count, request_messages(prompt, SummaryRequest("", "", max_tokens))))
    partial = max(max_tokens, count({"content": previous}) if previous else 0)
    room = window - fixed - partial - max_tokens - MARGIN
    costs = [count({"content": transcript(shown, [i])}) for i in source]
    runs = chunks(source, costs, room)
    if runs is None:
        raise SummaryFailed(
            "too_long",
            f"{sum(costs)} tokens of turns do not fit a {window}-token window in few calls",
        )
    text, usage, model = previous, None, summarizer.model
    for run in runs:
        output = await summarizer.summarize(
            SummaryRequest(text, transcript(shown, run), max_tokens)
        )
        text, model = output.text, output.model
        usage = _summed(usage, output.usage)
    assert text is not None  # at least one run: the source is never empty here
    return SummaryOutput(text=text, model=model, usage=usage)


def _summed(total: dict[str, Any] | None, usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two calls' usage, their integer counts added (None: neither reported any)."""
    if usage is None:
        return total
    if total is None:
        return dict(usage)
    out = dict(total)
    for key, value in usage.items():
        if isinstance(value, int) and isinstance(out.get(key), int):
            out[key] += value
        elif key not in out:
            out[key] = value
    out["calls"] = int(total.get("calls", 1)) + 1
    return out
