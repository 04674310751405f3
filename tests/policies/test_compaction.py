"""policies.compaction: what a compaction leaves the client, where the newest turn starts."""

from __future__ import annotations

from policies.compaction import NEXT_TURN, compaction_spec, newest_turn, pinned, retained
from policies.summarize import plan
from policies.types import Budget, SummarizerSpec

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


def test_the_compaction_spec_summarizes_every_real_turn():
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "a"},
        CALL,
        OUTPUT,
        {"role": "user", "content": "b"},
        {"role": "assistant", "content": "done"},
    ]
    planned = plan([*items, NEXT_TURN], compaction_spec(SummarizerSpec()), count, Budget())
    assert planned.task is not None
    assert planned.task.end == len(items)
    assert planned.task.source == (1, 2, 3, 4, 5)
