"""`python -m proxy replay FILE --config PATH --policy NAME`: replay through a policy, offline.

Each user message is sent with everything before it, as a client would, to
the proxy's own rewriter and token counter; a row per turn says what the
policy did. A summarize policy runs with its summaries kept in memory
(:mod:`proxy.offline_summaries`) and made by the deterministic extractive
stand-in (``ctxproxy/extractive``), whatever model the policy names: offline
means no model is called. Its rows say what became of the summary, and how
large the forwarded one is.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import TextIO

import orjson

from policies.types import Decision, Message, SummarizeSpec
from proxy.config.loader import describe, load_config
from proxy.config.model import Config
from proxy.context.offline_summaries import OfflineSummaries
from proxy.context.summarizer import EXTRACTIVE_MODEL
from proxy.errors import ConfigError
from proxy.ops.replay import (
    COLUMNS,
    SUMMARY_COLUMNS,
    Decide,
    NamedConversation,
    ReplayFormatError,
    TurnResult,
    format_row,
    format_totals,
    load_file,
    replay,
    requests,
)

# Replays with fewer turns than this finish before progress would be worth showing.
PROGRESS_MIN_TURNS = 50


def _load(path: str, err: TextIO) -> Config | None:
    try:
        return load_config(path)
    except ConfigError as exc:
        print(describe(exc, path), file=err)
        return None


class Progress:
    """Turns replayed so far, on stderr: a live line on a terminal, else every 10%."""

    def __init__(self, total: int, stream: TextIO, enabled: bool) -> None:
        self.total = total
        self.stream = stream
        self.enabled = enabled and total >= PROGRESS_MIN_TURNS
        self.tty = stream.isatty()
        self.done = 0
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._last_step = 0

    def advance(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw >= 0.1 or self.done == self.total:
                self._last_draw = now
                self.stream.write(f"\rreplaying: {self.done}/{self.total} turns")
                self.stream.flush()
            return
        step = self.done * 10 // self.total
        if step > self._last_step:
            self._last_step = step
            self.stream.write(f"replaying: {self.done}/{self.total} turns ({step * 10}%)\n")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.started
            end = "\n" if self.tty else ""
            self.stream.write(f"{end}replayed {self.done} turns in {elapsed:.1f} s\n")


def run_replay(ns: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    config = _load(ns.config, err)
    if config is None:
        return 2
    if ns.policy not in config.policies:
        names = ", ".join(sorted(config.policies))
        print(f"no policy {ns.policy!r} in {ns.config} (have: {names})", file=err)
        return 2
    try:
        conversations = load_file(ns.file)
    except (OSError, ReplayFormatError) as exc:
        print(f"cannot replay {ns.file}: {exc}", file=err)
        return 2
    if ns.index is not None:
        if not 0 <= ns.index < len(conversations):
            print(f"--index must be 0..{len(conversations) - 1}", file=err)
            return 2
        conversations = [conversations[ns.index]]

    from proxy.context.model_info import offline_environment
    from proxy.context.rewriter import Rewriter

    offline_environment()
    rewriter = Rewriter(config.policies)
    body = {"model": ns.model}
    spec = rewriter.spec(ns.policy)

    def decide(messages: Sequence[Message]) -> Decision:
        return rewriter.decide(ns.policy, messages, body, ns.model)

    def summaries(conversation: Sequence[Message]) -> OfflineSummaries | None:
        """A fresh in-memory store per conversation, as each is a session of its own."""
        if not isinstance(spec, SummarizeSpec):
            return None
        budget, _ = rewriter.budget(spec, body, ns.model)
        return OfflineSummaries(spec, rewriter.counter(conversation, ns.model), budget)

    total = sum(sum(1 for _ in requests(c.messages)) for c in conversations)
    progress = Progress(total, err, enabled=not ns.no_progress)
    for n, conversation in enumerate(conversations, start=1):
        state = summaries(conversation.messages)
        _replay_one(ns, n, len(conversations), conversation, decide, state, progress, out)
    progress.finish()
    return 0


def _replay_one(
    ns: argparse.Namespace,
    n: int,
    count: int,
    conversation: NamedConversation,
    decide: Decide,
    summaries: OfflineSummaries | None,
    progress: Progress,
    out: TextIO,
) -> None:
    answered: Callable[[Sequence[Message]], None] | None = None
    if summaries is not None:
        decide, answered = summaries.decide, summaries.prepare
    results: list[TurnResult] = []
    if not ns.jsonl:
        offline = f", summarizer {EXTRACTIVE_MODEL} (offline)" if summaries is not None else ""
        print(
            f"# {conversation.name} ({n}/{count}): {len(conversation.messages)} messages, "
            f"policy {ns.policy}, model {ns.model}{offline}",
            file=out,
        )
        print(COLUMNS if summaries is None else SUMMARY_COLUMNS, file=out)
    for result in replay(conversation.messages, decide, answered):
        results.append(result)
        progress.advance()
        if ns.jsonl:
            line = {"conversation": conversation.name, **result.as_dict()}
            out.write(orjson.dumps(line).decode() + "\n")
        else:
            print(format_row(result), file=out)
    if ns.jsonl:
        return
    print(format_totals(results), file=out)
    if summaries is not None:
        made = summaries.calls - summaries.waits
        print(
            f"summarizer calls: {summaries.calls} ({summaries.waits} a request waited for, "
            f"{made} made ahead after an answer), {summaries.failed} failed",
            file=out,
        )
    print(file=out)
