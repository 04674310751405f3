"""policies.compaction: what a compaction leaves the client, where the newest turn starts."""

from __future__ import annotations

from policies.compaction import fold, newest_turn, pinned, retained
from policies.items import ItemShape, is_summary, recallable
from policies.transcript import summary_content
from policies.types import SummarizerSpec, SummaryState

CALL = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "a.py"}


def count(message: object) -> int:
    return len(str(message)) // 4 + 1


def test_retained_are_the_user_messages_in_order_as_output_items():
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "first"},
        CALL,
        OUTPUT,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "second"}]},
    ]
    assert retained(items) == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first"}]},
        items[5],
    ]


def test_the_newest_turn_starts_at_the_last_user_message_not_inside_a_call():
    items = [{"role": "user", "content": "a"}, CALL, OUTPUT, {"role": "user", "content": "b"}]
    assert newest_turn(items) == 3
    # A user message between a call and its output does not start a turn there.
    split = [{"role": "user", "content": "a"}, CALL, {"role": "user", "content": "b"}, OUTPUT]
    assert newest_turn(split) == 0
    assert newest_turn([CALL, OUTPUT]) == 0


def test_pinned_keeps_system_and_developer_messages():
    items = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, CALL, OUTPUT]
    assert pinned(items) == [items[0]]


def test_a_fold_summarizes_every_real_turn():
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "a"},
        CALL,
        OUTPUT,
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "done"},
    ]
    task = fold(items, SummarizerSpec(), count).task
    assert task is not None and task.previous is None
    assert task.end == len(items)
    assert task.source == (1, 2, 3, 4, 5)


def summary_item(text: str) -> dict[str, object]:
    content = [{"type": "input_text", "text": summary_content(text, ())}]
    return {"type": "message", "role": "user", "content": content}


def test_a_fold_extends_the_newest_summary_even_where_it_ends_mid_turn():
    # Codex after a compaction: the restored turns, its retained messages, the expanded
    # summary, then the model's calls with no user message between.
    restored = [{"role": "user", "content": "a"}, CALL, OUTPUT]
    window = [{"role": "user", "content": "a"}, summary_item("first summary")]
    call = {**CALL, "call_id": "c2"}
    newer = [call, {**OUTPUT, "call_id": "c2"}]
    items = [*restored, *window, *newer]
    stored = SummaryState(len(restored), 0, "first summary", (), id=1)
    expanded = SummaryState(len(restored) + len(window), 0, "first summary")
    task = fold(items, SummarizerSpec(), count, [stored, expanded]).task
    assert task is not None and task.previous == expanded
    assert task.source == (5, 6) and task.end == len(items)
    # With the stored one alone, the expanded summary is still no turn of its own.
    task = fold(items, SummarizerSpec(), count, [stored]).task
    assert task is not None and task.previous == stored
    assert task.source == (3, 5, 6)


def test_a_fold_with_nothing_new_reuses_the_summary_covering_it_all():
    items = [{"role": "user", "content": "a"}, CALL, OUTPUT, {"role": "system", "content": "s"}]
    stored = SummaryState(3, 0, "all of it", (), id=4)
    planned = fold(items, SummarizerSpec(), count, [stored])
    assert planned.task is None and planned.reused == stored
    assert fold([], SummarizerSpec(), count).reused is None


def test_the_proxys_summary_and_compaction_items_are_not_turns():
    assert is_summary(summary_item("x"))
    assert is_summary({"role": "user", "content": summary_content("x", ())})
    assert not is_summary({"role": "user", "content": "Summary, please"})
    assert not is_summary({"role": "assistant", "content": summary_content("x", ())})
    items = [
        {"type": "compaction", "encrypted_content": "opaque"},
        {"type": "compaction_trigger"},
        summary_item("x"),
    ]
    assert fold(items, SummarizerSpec(), count).task is None
    # Recall never quotes them either; the turns they stand for stay recallable.
    assert [recallable(i) for i in [*items, CALL, OUTPUT]] == [False] * 3 + [True] * 2
    shape = ItemShape([CALL, OUTPUT, summary_item("x"), {"role": "user", "content": "a"}])
    assert [shape.unit(i) for i in range(4)] == [(0, 2), (0, 2), None, (3, 4)]
