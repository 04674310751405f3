"""Leave-one-conversation-out tuning (bench/recall_folds.py): the held-out figure is never the
in-sample one, and the choice is made without the held-out conversation."""

from __future__ import annotations

from bench.recall_folds import Outcome, best, folds, knee


def outcomes(kept_by_conversation: dict[int, tuple[int, int]]) -> list[Outcome]:
    """``{conversation: (kept, asked)}`` as outcomes of category 1."""
    out = []
    for conversation, (kept, asked) in kept_by_conversation.items():
        out += [Outcome(conversation, 1, k < kept, 0.25) for k in range(asked)]
    return out


def test_each_fold_chooses_without_its_held_out_conversation() -> None:
    # "overfit" is best only because of conversation 0; on the others "steady" wins.
    by_setting = {
        "steady": outcomes({0: (5, 10), 1: (8, 10), 2: (8, 10)}),
        "overfit": outcomes({0: (10, 10), 1: (7, 10), 2: (7, 10)}),
    }
    assert best(by_setting, {0, 1, 2}) == "overfit"
    found = {f.held_out: f for f in folds(by_setting, best)}
    assert found[0].chosen == "steady"
    assert [o.kept for o in found[0].test].count(True) == 5
    assert found[0].train == 0.8
    assert found[1].chosen == "overfit"  # 17/20 on {0, 2} against 13/20
    assert all(o.conversation == 1 for o in found[1].test)


def test_a_tie_goes_to_the_earlier_setting_in_the_grid() -> None:
    same = outcomes({0: (3, 4), 1: (3, 4)})
    assert best({"cheap": same, "dear": list(same)}, {0, 1}) == "cheap"


def test_the_knee_is_the_smallest_share_past_which_the_next_adds_under_5_points() -> None:
    by_share = {
        "0.1": outcomes({0: (50, 100)}),
        "0.2": outcomes({0: (60, 100)}),
        "0.3": outcomes({0: (63, 100)}),
        "0.4": outcomes({0: (70, 100)}),
    }
    assert knee(by_share, {0}) == "0.2"
    assert knee({"0.1": by_share["0.1"], "0.2": by_share["0.2"]}, {0}) == "0.2"
