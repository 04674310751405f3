"""The stable prefix: leading forwarded messages the session's previous request forwarded."""

from __future__ import annotations

from policies.types import Decision
from proxy.context.stable_prefix import StablePrefixes, common_prefix, forwarded_keys
from proxy.http.sessions import content_hash
from proxy.store.base import SessionRef

REF = SessionRef("t", "s")


def test_common_prefix():
    assert common_prefix(["a", "b"], ["a", "b", "c"]) == 2
    assert common_prefix(["a", "b", "c"], ["a", "x", "c"]) == 1
    assert common_prefix(["a", "b", "c"], ["a", "b"]) == 2
    assert common_prefix([], ["a"]) == 0


def test_first_request_is_zero_and_a_preview_does_not_move_the_previous_list():
    prefixes = StablePrefixes()
    assert prefixes.measure(REF, ["a", "b"]) == 0
    assert prefixes.measure(REF, ["a", "b", "c", "d"], remember=False) == 2
    assert prefixes.measure(REF, ["a", "x"]) == 1
    assert prefixes.measure(REF, ["a", "x", "y"]) == 2
    assert prefixes.measure(SessionRef("t", "other"), ["a", "x", "y"]) == 0


def test_bounded_by_sessions_and_keys():
    prefixes = StablePrefixes(max_sessions=2, max_keys=5)
    for n in range(4):
        prefixes.measure(SessionRef("t", str(n)), ["k"] * 2)
    assert len(prefixes) == 2
    prefixes.measure(SessionRef("t", "big"), ["k"] * 6)  # over the key bound: not kept
    assert prefixes.measure(SessionRef("t", "big"), ["k"] * 6) == 0


def test_made_messages_are_named_by_their_content_kept_ones_by_the_pipelines_hashes():
    conversation = [{"role": "user", "content": "u"}, {"role": "tool", "content": "long"}]
    hashes = ["h0", "h1"]
    masked = {"role": "tool", "content": "[omitted]"}
    aligned = Decision(messages=[conversation[0], masked], kept=(0, 1))
    assert forwarded_keys(aligned, conversation, hashes) == ["h0", content_hash(masked)]
    summary = {"role": "system", "content": "summary"}
    inserted = Decision(messages=[summary, conversation[1]], kept=(1,))
    assert forwarded_keys(inserted, conversation, hashes) == [content_hash(summary), "h1"]
