"""Who writes a summary's text: a model through a configured upstream, or an offline stand-in.

The LLM summarizer sends one chat completion (no stream; temperature 0 and
``max_tokens``, or for a reasoning model, which rejects both,
``max_completion_tokens`` and a low reasoning effort: see
:func:`proxy.context.model_info.completion_params`) through the same
:class:`~proxy.upstream.base.Upstream` the routes use, so an OpenAI-compatible
upstream gets a plain POST to ``/chat/completions`` and a ``litellm_model``
upstream is translated by litellm. Anything but a non-empty answer within the timeout is a
:class:`SummaryFailed` with a reason (``timeout``, ``error``, ``empty``), and so is
an answer that is not a summary (:mod:`proxy.context.summary_check`: ``cut_off``
at ``max_tokens``, or an ``echo`` of its input): the caller falls back to
trimming and stores nothing. The instructions go in a system message, or, for
an upstream whose chat template shows the model none
(``system_messages: none``), at the head of the user message.

The extractive summarizer needs no model: it keeps the first sentence of
each message, newest last, within the token budget. It is deterministic, so
the replay bench and tests can run summarization offline
(``summarizer.model: ctxproxy/extractive``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.context.model_info import completion_params
from proxy.context.summary_check import check_summary
from proxy.errors import ProxyError
from proxy.upstream.base import Upstream, UpstreamRequest

EXTRACTIVE_MODEL = "ctxproxy/extractive"
# Sent with every summarizer call, so an upstream's logs (and test fakes) can
# tell a summary from a user's request.
SUMMARIZER_HEADER = "x-ctxproxy-summarizer"

DEFAULT_PROMPT = """\
You are ctxproxy-summarizer. You keep the running summary of a conversation between a user \
and an assistant, so that the assistant can continue it without the earlier turns.

Write a factual snapshot in these sections, each a few short bullet points (leave out a \
section with nothing in it):
## Goal and context
## Reported problem
## Steps tried and results
## Identifiers (ids, order and ticket numbers, error codes, versions, amounts, dates, \
emails, URLs: copied exactly)
## Timeline
## Current status and blockers
## Next step

Rules:
- State only what the conversation says. Invent nothing and do not guess.
- Copy identifiers, numbers and codes character for character.
- Mark anything uncertain, or claimed but not confirmed, as UNVERIFIED.
- When a later turn corrects or replaces a fact, keep the new one and note the old one as \
superseded.
- Tool results are clipped: say what they established, not their raw data.
- Given a previous summary, return the whole updated summary: keep what still holds and \
fold the new turns in.
"""


def prompt_hash(prompt: str) -> str:
    """Identity of a prompt (and of the input format it is used with), stored with summaries."""
    return hashlib.sha256(b"ctxproxy-summary-v1\n" + prompt.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SummaryRequest:
    # The summary so far (an incremental summary extends it), or None.
    previous: str | None
    # The turns to fold in, as a labelled transcript (policies.transcript).
    transcript: str
    # The answer's token budget.
    max_tokens: int


@dataclass(frozen=True)
class SummaryOutput:
    text: str
    model: str | None
    usage: dict[str, Any] | None = None


class SummaryFailed(Exception):
    """No usable summary: ``reason`` is ``timeout``, ``error``, ``empty``, ``cut_off``
    or ``echo``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Summarizer(Protocol):
    model: str | None
    prompt_hash: str

    async def summarize(self, request: SummaryRequest) -> SummaryOutput:
        """The summary's text; raises :class:`SummaryFailed`."""
        ...


def request_messages(
    prompt: str, request: SummaryRequest, *, system: bool = True
) -> list[dict[str, str]]:
    """The chat messages of a summarizer call: the instructions, then what to summarize.

    ``system``: the instructions in a system message; else ahead of the task in the
    user message (a template that drops system messages still shows them)."""
    length = f"at most about {request.max_tokens} tokens"
    if request.previous:
        task = (
            f"The summary so far:\n<summary>\n{request.previous}\n</summary>\n\n"
            f"New turns since then:\n<turns>\n{request.transcript}\n</turns>\n\n"
            f"Return the whole updated summary ({length})."
        )
    else:
        task = (
            f"The conversation so far:\n<turns>\n{request.transcript}\n</turns>\n\n"
            f"Return the summary ({length})."
        )
    if not system:
        return [{"role": "user", "content": f"{prompt}\n{task}"}]
    return [{"role": "system", "content": prompt}, {"role": "user", "content": task}]


class LLMSummarizer:
    """A chat completion through ``upstream`` (any Upstream: OpenAI-compatible or litellm)."""

    def __init__(
        self,
        upstream: Upstream,
        *,
        model: str,
        prompt: str | None = None,
        timeout_s: float = 20.0,
        headers: Mapping[str, str] | None = None,
        system: bool = True,
    ) -> None:
        self.upstream = upstream
        self.model: str | None = model
        self.prompt = prompt or DEFAULT_PROMPT
        self.system = system
        # The input format is part of the prompt's identity (stored with each summary).
        self.prompt_hash = prompt_hash(self.prompt if system else f"user\n{self.prompt}")
        self.timeout_s = timeout_s
        self.headers = {**(headers or {}), "content-type": "application/json"}
        self.headers[SUMMARIZER_HEADER] = "1"

    async def summarize(self, request: SummaryRequest) -> SummaryOutput:
        body = {
            "model": self.model,
            "messages": request_messages(self.prompt, request, system=self.system),
            **completion_params(self.model or "", request.max_tokens),
            "stream": False,
        }
        try:
            async with asyncio.timeout(self.timeout_s):
                status, content = await self._send(body)
        except TimeoutError as exc:
            raise SummaryFailed("timeout", f"no answer within {self.timeout_s:g} s") from exc
        except ProxyError as exc:  # unreachable, or the upstream's own timeout
            reason = "timeout" if exc.status == 504 else "error"
            raise SummaryFailed(reason, exc.message) from exc
        if status != 200:
            raise SummaryFailed("error", f"the upstream answered {status}: {content[:200]!r}")
        output, finish_reason = self._parse(content)
        verdict = check_summary(output.text, request.transcript, finish_reason)
        if verdict.reason is not None:
            raise SummaryFailed(verdict.reason, verdict.detail)
        return output

    # Where the call goes below the upstream's base URL, and what it answers.
    path = "/chat/completions"
    answer = "a chat completion"

    def _call(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        """The body and headers a call sends (a chat completion as it is)."""
        return body, dict(self.headers)

    async def _send(self, body: dict[str, Any]) -> tuple[int, bytes]:
        call, headers = self._call(body)
        response = await self.upstream.send(
            UpstreamRequest(
                method="POST", path=self.path, headers=headers, body=orjson.dumps(call), json=call
            )
        )
        try:
            return response.status, await response.read()
        finally:
            await response.close()

    def _answer(self, data: Any) -> tuple[object, object]:
        """The answer's text and why it stopped, as a chat completion says (``length``: cut
        off); raises a lookup or type error if it has none."""
        choice = data["choices"][0]
        message = choice["message"]
        text = message.get("content") if isinstance(message, dict) else None
        return text, choice.get("finish_reason")

    def _parse(self, content: bytes) -> tuple[SummaryOutput, str | None]:
        try:
            data = orjson.loads(content)
            text, finish_reason = self._answer(data)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise SummaryFailed("error", f"the answer is not {self.answer}") from exc
        if not isinstance(text, str) or not text.strip():
            raise SummaryFailed("empty", "the summarizer answered with no text")
        usage = data.get("usage")
        model = data.get("model")
        output = SummaryOutput(
            text=text.strip(),
            model=model if isinstance(model, str) else self.model,
            usage=usage if isinstance(usage, dict) else None,
        )
        return output, finish_reason if isinstance(finish_reason, str) else None


class AnthropicSummarizer(LLMSummarizer):
    """The summarizer on an ``api: anthropic`` upstream: a Messages API call."""

    # The API version a call is made with when the client sent none.
    VERSION = "2023-06-01"

    path = "/messages"
    answer = "a message"

    def _call(self, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        messages = body["messages"]
        call: dict[str, Any] = {
            "model": body["model"],
            "messages": [m for m in messages if m["role"] != "system"],
            "max_tokens": body.get("max_completion_tokens") or body.get("max_tokens") or 1024,
        }
        system = [m["content"] for m in messages if m["role"] == "system"]
        if system:
            call["system"] = "\n\n".join(system)
        return call, {"anthropic-version": self.VERSION, **self.headers}

    def _answer(self, data: Any) -> tuple[object, object]:
        text = "".join(b.get("text", "") for b in data["content"] if b.get("type") == "text")
        # Anthropic's max_tokens stop is a chat completion's length: the summary was cut off.
        stop = data.get("stop_reason")
        return text, "length" if stop == "max_tokens" else stop


_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_LABEL = re.compile(r"^\[(.+?)\]$")


class ExtractiveSummarizer:
    """An offline stand-in: the first sentence of each message, newest kept within budget.

    Deterministic and free: for the replay bench, tests, and a proxy run with
    no model to spare. Its "summary" is a list of quotes, so nothing in it is
    ever invented.
    """

    def __init__(
        self, count_text: Callable[[str], int] | None = None, sentence_chars: int = 160
    ) -> None:
        self.model: str | None = EXTRACTIVE_MODEL
        self.prompt_hash = prompt_hash(EXTRACTIVE_MODEL)
        self._count = count_text or (lambda text: len(text) // 4 + 1)
        self._chars = sentence_chars

    async def summarize(self, request: SummaryRequest) -> SummaryOutput:
        return self.make(request)

    def make(self, request: SummaryRequest) -> SummaryOutput:
        lines = [line for line in (request.previous or "").splitlines() if line.strip()]
        lines += self._quotes(request.transcript)
        # Newest first until the budget is spent; then back in order.
        kept: list[str] = []
        used = 0
        for line in reversed(lines):
            cost = self._count(line)
            if used + cost > request.max_tokens:
                break
            kept.append(line)
            used += cost
        text = "\n".join(reversed(kept))
        if not text:
            raise SummaryFailed("empty", "nothing to quote within the budget")
        return SummaryOutput(text=text, model=EXTRACTIVE_MODEL, usage=None)

    def _quotes(self, transcript: str) -> list[str]:
        out: list[str] = []
        label = ""
        for block in transcript.split("\n\n"):
            head, _, body = block.partition("\n")
            found = _LABEL.match(head.strip())
            if found is None:
                body = block
            else:
                label = found.group(1)
            if label.startswith("tool result") or "called tool" in label:
                continue  # data, not conversation: their facts are pinned anyway
            first = _SENTENCE.split(" ".join(body.split()), maxsplit=1)[0][: self._chars]
            if first:
                out.append(f"- {label}: {first}")
        return out
