"""Fusing lexical and semantic hits (policies/fusion.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.fusion import fuse
from policies.recall import Hit

LEX = [Hit(10, 8.0, 110), Hit(4, 4.0, 104), Hit(7, 2.0, 107)]
SEM = [Hit(3, 0.9, 103), Hit(4, 0.6, 104), Hit(12, 0.3, 112)]


def test_the_weighted_sum_of_each_list_scaled_by_its_best():
    fused = {h.index: h.score for h in fuse(LEX, SEM, 0.5)}
    assert fused[10] == pytest.approx(0.5 * 1.0, abs=1e-4)
    assert fused[3] == pytest.approx(0.5 * 1.0, abs=1e-4)
    # In both lists: both shares add up, so it comes first.
    assert fused[4] == pytest.approx(0.5 * 0.5 + 0.5 * 0.6 / 0.9, abs=1e-4)
    assert max(fused, key=lambda i: fused[i]) == 4


def test_weight_zero_is_the_lexical_order_then_the_semantic_one():
    assert [h.index for h in fuse(LEX, SEM, 0.0)] == [10, 4, 7, 3, 12]


def test_weight_one_is_the_semantic_order_then_the_lexical_one():
    assert [h.index for h in fuse(LEX, SEM, 1.0)] == [3, 4, 12, 10, 7]


def test_item_ids_are_kept_and_negative_similarity_counts_as_nothing():
    fused = fuse([], [Hit(1, -0.2, 5), Hit(2, 0.5, 6)], 1.0)
    assert [(h.index, h.item_id) for h in fused] == [(2, 6), (1, 5)]
    assert fused[1].score < 1e-5


def test_a_weight_outside_0_1_is_refused():
    with pytest.raises(ValueError):
        fuse(LEX, SEM, 1.5)


hits = st.lists(
    st.builds(Hit, st.integers(0, 30), st.floats(-1, 50, allow_nan=False), st.none()),
    max_size=20,
)


@given(hits, hits, st.floats(0, 1))
def test_one_hit_per_position_of_either_list_best_first(lex, sem, w):
    fused = fuse(lex, sem, w)
    assert sorted(h.index for h in fused) == sorted({h.index for h in [*lex, *sem]})
    assert [h.score for h in fused] == sorted((h.score for h in fused), reverse=True)
    assert all(h.score >= 0 for h in fused)
