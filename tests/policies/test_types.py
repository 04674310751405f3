"""policies/types.py: Decision.but is dataclasses.replace, for every field."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from policies.types import Decision

BASE = Decision(
    messages=[{"role": "user", "content": "hi"}],
    kept=(0,),
    dropped=(1,),
    reason="max_tokens",
    tokens_before=9,
    tokens_after=4,
    budget=5,
    extra={"recall_budget": 2},
)

CHANGES: dict[str, Any] = {
    "messages": [],
    "kept": (0, 2),
    "dropped": (),
    "repaired": (1,),
    "clipped": (),
    "masked": (),
    "turns_dropped": 3,
    "reason": None,
    "tokens_before": 1,
    "tokens_after": 2,
    "budget": None,
    "extra": {"calibration": 1.1},
}


def test_every_field_is_named_here() -> None:
    assert set(CHANGES) == {f.name for f in dataclasses.fields(Decision)}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_but_changes_one_field_as_replace_does_and_leaves_the_original(name: str) -> None:
    before = dict(vars(BASE))
    changed = BASE.but(**{name: CHANGES[name]})
    assert changed == dataclasses.replace(BASE, **{name: CHANGES[name]})
    assert getattr(changed, name) is CHANGES[name]
    assert vars(BASE) == before  # the original is as it was


def test_but_with_several_changes_and_with_none() -> None:
    assert BASE.but(**CHANGES) == Decision(**CHANGES)
    same = BASE.but()
    assert same == BASE and same is not BASE


def test_but_refuses_a_name_that_is_not_a_field() -> None:
    with pytest.raises(TypeError, match="tokens"):
        BASE.but(tokens=3)
