"""Codex's item shapes through every policy: trimming, masking, clipping and recall never
split a call from its output or a reasoning item from the item it leads into, and every
item they keep unaltered is forwarded as the very object that came.

The oracle is the generator's own record of what belongs together (each call's output
by ``call_id``, each reasoning item's follower), not policies/items.py's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from policies.items import ItemShape, apply_items
from policies.recall import Hit, recall
from policies.types import Budget, ContextTooLong, Decision, MaskSpec, NoneSpec, TrimSpec
from tests import codex_items as codex


def count(item: dict[str, Any]) -> int:
    """A deterministic stand-in for a tokenizer: 3 an item, 1 per 4 characters of text."""
    text = "".join(
        str(item.get(k) or "") for k in ("content", "arguments", "output", "input", "summary")
    )
    return 3 + len(text) // 4


@dataclass
class History:
    items: list[dict[str, Any]] = field(default_factory=list)
    # Index of each reasoning item -> index of the item it leads into.
    leads: dict[int, int] = field(default_factory=dict)
    # call index -> output index.
    pairs: dict[int, int] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)

    def add(self, item: dict[str, Any]) -> int:
        self.items.append(item)
        return len(self.items) - 1

    def reasoned(self, item: dict[str, Any], n: int, think: bool) -> int:
        if think:
            r = self.add(codex.reasoning("thinking", n))
            self.leads[r] = r + 1
        return self.add(item)


# One step of a turn: what the model did next (each with or without reasoning before it).
STEPS = st.sampled_from(["exec", "parallel", "patch", "mcp", "shell", "search", "unknown", "say"])


@st.composite
def histories(draw: Any) -> History:
    h = History()
    h.add(codex.developer("<permissions instructions>sandbox: workspace-write"))
    n = 0
    for t in range(draw(st.integers(1, 8))):
        h.add(codex.user(f"Turn {t}: do task {t}."))
        for step in draw(st.lists(STEPS, max_size=5)):
            n += 1
            think = draw(st.booleans())
            size = draw(st.integers(0, 120))
            if step == "exec":
                call = h.reasoned(codex.exec_call(f"c{n}", "ls"), n, think)
                h.pairs[call] = h.add(codex.exec_output(f"c{n}", codex.listing(t, lines=size)))
            elif step == "parallel":
                a = h.reasoned(codex.exec_call(f"a{n}", "ls"), n, think)
                b = h.add(codex.exec_call(f"b{n}", "pwd"))
                h.pairs[a] = h.add(codex.exec_output(f"a{n}", codex.listing(t, lines=size)))
                h.pairs[b] = h.add(codex.exec_output(f"b{n}", "/repo"))
            elif step == "patch":
                call = h.reasoned(codex.patch_call(f"p{n}", f"f{n}.py"), n, think)
                h.pairs[call] = h.add(codex.patch_output(f"p{n}", f"f{n}.py" * (size + 1)))
            elif step == "mcp":
                call = h.reasoned(codex.namespaced_call(f"m{n}", "crash"), n, think)
                output = {"type": "function_call_output", "call_id": f"m{n}", "output": "x" * size}
                h.pairs[call] = h.add(output)
            elif step == "image":
                call = h.reasoned(codex.namespaced_call(f"i{n}", "screenshot"), n, think)
                h.pairs[call] = h.add(codex.image_output(f"i{n}", "x" * size))
            elif step == "find":
                found, listed = codex.tool_search(f"t{n}", "gmail")
                h.pairs[h.reasoned(found, n, think)] = h.add(listed)
            elif step == "shell":
                call = h.reasoned(codex.shell_call(f"s{n}", "ls"), n, think)
                h.pairs[call] = h.add(codex.exec_output(f"s{n}", codex.listing(t, lines=size)))
            elif step == "search":
                h.reasoned(codex.web_search(f"query {n}"), n, think)
            elif step == "unknown":
                h.unknown.append(h.reasoned(codex.unknown(n), n, think))
            else:
                h.reasoned(codex.assistant(f"Done with step {n}."), n, think)
    return h


MASKS = st.one_of(
    st.none(),
    st.builds(
        MaskSpec,
        after_turns=st.integers(1, 3),
        min_tokens=st.integers(32, 80),
        step_tokens=st.integers(0, 400),
    ),
)
TRIMS = st.builds(
    TrimSpec,
    max_turns=st.one_of(st.none(), st.integers(1, 6)),
    max_tokens=st.integers(150, 3000),
    low_water=st.one_of(st.none(), st.floats(0.3, 1.0)),
    tool_output_max_tokens=st.one_of(st.none(), st.integers(20, 200)),
    mask_tool_outputs=MASKS,
)
SPECS = st.one_of(TRIMS, st.builds(NoneSpec, mask_tool_outputs=MASKS))


def decide(h: History, spec: TrimSpec | NoneSpec) -> Decision:
    limit = spec.max_tokens if isinstance(spec, TrimSpec) else None
    try:
        return apply_items(h.items, spec, count, Budget(limit=limit))
    except ContextTooLong:
        assume(False)
        raise


def check_whole(h: History, d: Decision) -> None:
    """The rules every decision over Codex items keeps (module docstring)."""
    kept = list(d.kept)
    assert kept == sorted(set(kept))
    at = {i: k for k, i in enumerate(kept)}
    changed = {c.index for c in d.clipped} | {m.index for m in d.masked}
    for i, k in at.items():
        sent, original = d.messages[k], h.items[i]
        if i in changed:
            # Only a tool output's text changes; the item, its type and call_id stay.
            assert {**sent, "output": None} == {**original, "output": None}
            assert original["type"] in ("function_call_output", "custom_tool_call_output")
        else:
            assert sent is original
    for call, output in h.pairs.items():
        assert (call in at) == (output in at), (h.items[call], h.items[output])
    for r, follower in h.leads.items():
        assert (r in at) == (follower in at), h.items[follower]
        if r in at:
            assert at[follower] == at[r] + 1  # right after it, as it came
    for u in h.unknown:
        if u in at:
            assert d.messages[at[u]] is h.items[u]
    assert not codex.pairing_problems([d.messages[k] for k in range(len(kept))])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=histories(), spec=SPECS)
def test_no_policy_splits_a_codex_pair_or_alters_what_it_keeps(h, spec):
    d = decide(h, spec)
    check_whole(h, d)
    # Developer instructions are pinned.
    assert 0 in d.kept


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(h=histories(), spec=TRIMS, data=st.data())
def test_recall_brings_codex_units_back_whole(h, spec, data):
    d = decide(h, spec)
    assume(d.dropped)
    picks = data.draw(st.lists(st.sampled_from(list(d.dropped)), min_size=1, max_size=4))
    hits = [Hit(index=i, score=1.0 + n) for n, i in enumerate(picks)]
    _, recalled = recall(h.items, d, hits, count, 2000, neighbors=1, shape=ItemShape(h.items))
    back = {i for start, end in recalled.spans for i in range(start, end)}
    kept = set(d.kept)
    for call, output in h.pairs.items():
        assert (call in back) == (output in back)
    for r, follower in h.leads.items():
        # Reasoning comes back with the item it leads into (unless that one was kept).
        if r in back:
            assert follower in back or follower in kept
        if follower in back and r not in kept:
            assert r in back


def test_old_codex_tool_outputs_are_masked_in_place_with_their_call_id():
    items = [item for t in range(1, 5) for item in codex.turn(t)]
    spec = NoneSpec(mask_tool_outputs=MaskSpec(after_turns=1, min_tokens=32, step_tokens=0))
    d = apply_items(items, spec, count, Budget())
    masked = {m.index for m in d.masked}
    # The long exec_command outputs of the three older turns; never the newest turn's.
    assert [items[i]["call_id"] for i in sorted(masked)] == [
        "call_exec_1",
        "call_exec_2",
        "call_exec_3",
    ]
    for i in masked:
        assert d.messages[i]["output"].startswith("[tool output of ")
        assert d.messages[i]["type"] == "function_call_output"
        assert d.messages[i]["call_id"] == items[i]["call_id"]
    assert len(d.messages) == len(items)
    assert d.tokens_after < d.tokens_before


def test_trimming_codex_items_masks_before_it_drops():
    items = [item for t in range(1, 7) for item in codex.turn(t)]
    whole = sum(map(count, items))
    mask = MaskSpec(after_turns=2, min_tokens=32, step_tokens=0)
    # A budget the masked history fits, the whole one does not.
    d = apply_items(
        items, TrimSpec(max_tokens=whole - 600, mask_tool_outputs=mask), count, Budget()
    )
    assert d.masked and not d.dropped
    assert not codex.pairing_problems(d.messages)


def test_a_local_shell_call_answered_as_codex_does_is_a_pair_not_broken_input():
    items = [
        codex.user("list the repo"),
        codex.reasoning("Listing", 1),
        codex.shell_call("s1", "ls"),
        codex.exec_output("s1", "README.md"),
        codex.assistant("One file."),
        codex.user("and now?"),
    ]
    d = apply_items(items, TrimSpec(max_turns=5), count, Budget())
    assert d.repaired == () and d.messages == items
    # Dropped, the pair goes together (with the reasoning that led into it).
    d = apply_items(items, TrimSpec(max_turns=1), count, Budget())
    assert d.messages == [items[-1]]


def test_a_recalled_namespaced_call_is_quoted_with_its_namespace():
    items = [codex.user("find it"), codex.namespaced_call("m1", "crash")]
    quoted = ItemShape(items).quoted(1)
    assert quoted["text"] == 'mcp__github__.search_issues({"query":"crash"})'
    assert quoted["call_id"] == "m1"
