"""A message's content hash (its stored identity) is the same on the fast path as on the general one."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from proxy.http.sessions import _canonical, content_hash


def general(message: dict[str, Any]) -> str:
    """The identity as it has always been computed (and is stored)."""
    data = orjson.dumps(_canonical(message), option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


# Integers within what a JSON body can carry (orjson refuses wider ones either way).
_value = (
    st.none()
    | st.text(max_size=8)
    | st.integers(-(2**63), 2**63 - 1)
    | st.lists(st.text(max_size=3), max_size=2)
)


@given(
    keys=st.lists(
        st.sampled_from(["role", "content", "name", "refusal", "tool_calls", "x"]),
        min_size=2,
        max_size=2,
        unique=True,
    ),
    values=st.lists(_value, min_size=2, max_size=2),
)
def test_a_two_field_message_hashes_as_the_general_path_does(
    keys: list[str], values: list[Any]
) -> None:
    message = dict(zip(keys, values, strict=True))
    assert content_hash(message) == general(message)


def test_the_usual_message_keeps_the_identity_rows_already_hold() -> None:
    message = {"role": "user", "content": 'hi \u00e9 "quoted"'}
    # What the general path gave this message before the fast path existed.
    assert content_hash(message) == "7acf755ff3024c4ce31b5aff35e139de"
    assert content_hash({"content": "hi", "role": "user"}) == content_hash(
        {"role": "user", "content": "hi"}
    )
    assert content_hash({"role": "user", "content": ""}) == general({"role": "user"})
