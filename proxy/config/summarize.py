"""Config for summarization: `strategy: summarize` policies, the built-in modes, route modes.

Read by proxy/config/loader.py (kept apart so that file stays about the whole
config); every error names the path of the bad key and the bad value, as
there (``policies.support.keep_last_turns: must be <= trigger.turns (8), got 9``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal, cast

from policies.modes import MODES, ModeRule
from policies.types import PolicySpec, SummarizerSpec, SummarizeSpec
from proxy.config.model import COMPACTION_SUMMARIZER, ModesConfig
from proxy.config.node import Node
from proxy.config.recall import recall_spec
from proxy.errors import ConfigError

# Built in, like `passthrough`; a policy of the same name in the file replaces one.
BUILTIN_MODES: Mapping[str, PolicySpec] = dict(MODES)

SUMMARIZE_KEYS = frozenset(
    {
        "strategy",
        "trigger",
        "keep_last_turns",
        "keep_first_turns",
        "max_tokens",
        "low_water",
        "summary_share",
        "tool_output_max_tokens",
        "summarizer",
        "placement",
        "prefetch",
        "recall",
    }
)
SUMMARIZER_KEYS = frozenset(
    {"model", "upstream", "max_tokens", "prompt_file", "timeout_s", "context_window"}
)


def summarize_policy(node: Node, base_dir: Path, upstreams: Mapping[str, Any]) -> SummarizeSpec:
    node = Node(node.path, node.value, set(SUMMARIZE_KEYS))
    trigger = node.child("trigger", {"turns", "tokens"})
    turns = trigger.integer("turns", minimum=1)
    tokens = trigger.integer("tokens", minimum=1)
    max_tokens = node.integer("max_tokens", minimum=1)
    if turns is None and tokens is None and max_tokens is None:
        raise ConfigError(
            node.at("trigger"), "needs turns or tokens (or the policy a max_tokens budget)"
        )
    keep_last = node.integer("keep_last_turns", 3, minimum=1)
    assert keep_last is not None  # it has a default
    if turns is not None and keep_last > turns:
        raise ConfigError(
            node.at("keep_last_turns"), f"must be <= trigger.turns ({turns}), got {keep_last}"
        )
    keep_first = node.integer("keep_first_turns", 0, minimum=0) or 0
    if turns is not None and keep_first + keep_last > turns:
        raise ConfigError(
            node.at("keep_first_turns"),
            f"plus keep_last_turns must be <= trigger.turns ({turns}), "
            f"got {keep_first} + {keep_last}",
        )
    share = node.number("summary_share", high=1.0)
    if share is not None and max_tokens is None and tokens is None:
        raise ConfigError(
            node.at("summary_share"), "needs a token budget: max_tokens or trigger.tokens"
        )
    placement = node.text("placement", "system")
    if placement not in ("system", "pair"):
        raise ConfigError(node.at("placement"), f"must be system or pair, got {placement!r}")
    prefetch = node.raw("prefetch")
    if prefetch is not None and not isinstance(prefetch, bool):
        raise ConfigError(node.at("prefetch"), f"must be true or false, got {prefetch!r}")
    return SummarizeSpec(
        trigger_turns=turns,
        trigger_tokens=tokens,
        keep_last_turns=keep_last,
        keep_first_turns=keep_first,
        max_tokens=max_tokens,
        low_water=node.number("low_water", 0.7, high=1.0) or 0.7,
        summary_share=share,
        tool_output_max_tokens=node.integer("tool_output_max_tokens", minimum=16),
        summarizer=_summarizer(node.child("summarizer", set(SUMMARIZER_KEYS)), base_dir, upstreams),
        placement="pair" if placement == "pair" else "system",
        prefetch=prefetch is not False,
        recall=recall_spec(node, has_budget=max_tokens is not None or tokens is not None),
    )


COMPACTION_MODES = ("auto", "proxy", "upstream", "off")


def route_compaction(
    node: Node, base_dir: Path, upstreams: Mapping[str, Any]
) -> tuple[Literal["auto", "proxy", "upstream", "off"], SummarizerSpec]:
    """A route's ``compaction`` (who answers it) and ``compaction_summarizer``."""
    mode = node.text("compaction", "auto")
    if mode not in COMPACTION_MODES:
        raise ConfigError(
            node.at("compaction"), f"must be auto, proxy, upstream or off, got {mode!r}"
        )
    summarizer = COMPACTION_SUMMARIZER
    if node.has("compaction_summarizer"):
        child = node.child("compaction_summarizer", set(SUMMARIZER_KEYS))
        summarizer = _summarizer(child, base_dir, upstreams, COMPACTION_SUMMARIZER)
    return cast(Literal["auto", "proxy", "upstream", "off"], mode), summarizer


def _summarizer(
    node: Node,
    base_dir: Path,
    upstreams: Mapping[str, Any],
    d: SummarizerSpec = SummarizerSpec(),  # noqa: B008 (frozen: shared safely)
) -> SummarizerSpec:
    upstream = node.text("upstream")
    if upstream is not None and upstream not in upstreams:
        raise ConfigError(node.at("upstream"), f"names no configured upstream: {upstream!r}")
    prompt_file = node.text("prompt_file")
    prompt = None
    if prompt_file is not None:
        path = Path(prompt_file)
        path = path if path.is_absolute() else base_dir / path
        try:
            prompt = path.read_text()
        except OSError as exc:
            raise ConfigError(
                node.at("prompt_file"), f"cannot read {str(path)!r}: {exc.strerror}"
            ) from exc
        if not prompt.strip():
            raise ConfigError(node.at("prompt_file"), f"{str(path)!r} is empty")
    return SummarizerSpec(
        model=node.text("model"),
        upstream=upstream,
        max_tokens=node.integer("max_tokens", d.max_tokens, minimum=16) or d.max_tokens,
        prompt=prompt,
        prompt_file=prompt_file,
        timeout_s=node.number("timeout_s", d.timeout_s) or d.timeout_s,
        context_window=node.integer("context_window", d.context_window, minimum=256),
    )


def check_route_policy(node: Node, path: str, spec: PolicySpec) -> None:
    """Summaries are made for chat completions; a Responses route cannot use one (yet)."""
    if isinstance(spec, SummarizeSpec) and fnmatchcase("/v1/responses", path):
        raise ConfigError(
            node.at("policy"),
            "a summarize policy serves /v1/chat/completions only, "
            f"but this route's path {path!r} matches /v1/responses",
        )


def route_modes(node: Node) -> ModesConfig | None:
    """A route's ``modes``: None when the route has none."""
    if not node.has("modes"):
        return None
    modes = node.child("modes", {"header", "rules"})
    header = modes.raw("header")
    if header is not None and not isinstance(header, bool):
        raise ConfigError(modes.at("header"), f"must be true or false, got {header!r}")
    raw_rules = modes.raw("rules") or []
    if not isinstance(raw_rules, list):
        raise ConfigError(modes.at("rules"), "must be a list of {match, mode}")
    rules = []
    for i, raw in enumerate(raw_rules):
        rule = Node(f"{modes.at('rules')}[{i}]", raw, {"match", "mode", "name"})
        pattern = rule.required_str("match")
        mode = rule.required_str("mode")
        if mode not in MODES:
            raise ConfigError(rule.at("mode"), f"must be one of {', '.join(MODES)}, got {mode!r}")
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                rule.at("match"), f"is not a valid regular expression: {exc}"
            ) from exc
        rules.append(ModeRule(compiled, mode, rule.text("name") or f"rules[{i}]"))
    return ModesConfig(header=header is True, rules=tuple(rules))
