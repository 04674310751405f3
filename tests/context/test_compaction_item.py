"""The proxy's compaction item: versioned and checked, expanded on any instance."""

from __future__ import annotations

import base64
import zlib

import orjson
import pytest

from proxy.context.compaction_item import (
    MAX_PAYLOAD,
    PREFIX,
    CompactionPayload,
    _check,
    decode,
    encode,
    expand,
    is_own,
    make_item,
)
from proxy.errors import InvalidRequest
from proxy.responses.items import item_hash
from proxy.store.base import chain_path_hashes

USER = {"role": "user", "content": "hello"}
DEV = {"role": "developer", "content": "rules"}
REPLY = {"role": "assistant", "content": "hi"}


def payload(**changes: object) -> CompactionPayload:
    base = CompactionPayload(summary="They said hello.", facts=({"kind": "id", "value": "A-1"},))
    return CompactionPayload(**{**base.__dict__, **changes})  # type: ignore[arg-type]


def test_an_item_round_trips_its_payload():
    item = make_item(payload(items=3, covers="abc", summary_id=7, created_at=5))
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert is_own(item) and item["encrypted_content"].startswith(PREFIX)
    assert decode(item["encrypted_content"]) == payload(
        items=3, covers="abc", summary_id=7, created_at=5
    )


@pytest.mark.parametrize(
    "damage",
    [
        lambda c: c[:-1] + ("0" if c[-1] != "0" else "1"),  # the checksum
        lambda c: c[: len(PREFIX) + 5] + "A" + c[len(PREFIX) + 6 :],  # the payload
        lambda c: c.rpartition(".")[0],  # no checksum
        lambda c: PREFIX,
    ],
)
def test_a_damaged_item_is_a_400_naming_where_it_is(damage):
    content = encode(payload())
    with pytest.raises(InvalidRequest) as caught:
        decode(damage(content), "input[3]")
    assert caught.value.param == "input[3]" and caught.value.code == "invalid_compaction_item"


def test_expansion_makes_a_user_message_with_the_summary_and_its_facts():
    out = expand([USER, make_item(payload()), USER], item_hash, keep_foreign=False)
    assert out.expanded == 1 and out.changed
    text = out.items[1]["content"][0]["text"]
    assert out.items[1]["role"] == "user"
    assert "Summary of the earlier conversation" in text and "They said hello." in text
    assert "A-1" in text
    assert out.previous is not None and out.previous.covers == 2


def test_covered_items_the_client_kept_are_folded_but_system_messages_stay():
    kept = [DEV, USER, REPLY]
    covers = chain_path_hashes([item_hash(i) for i in kept])[-1]
    item = make_item(payload(items=3, covers=covers))
    out = expand([*kept, item, USER], item_hash, keep_foreign=False)
    assert out.folded == 2
    assert out.items[0] == DEV and out.items[-1] == USER and len(out.items) == 3


def test_foreign_items_and_stray_triggers_are_taken_out_only_where_the_proxy_answers():
    foreign = {"type": "compaction", "encrypted_content": "gAAAA"}
    trigger = {"type": "compaction_trigger"}
    items = [USER, foreign, trigger, USER]
    dropped = expand(items, item_hash, keep_foreign=False)
    assert dropped.items == [USER, USER]
    assert (dropped.foreign_dropped, dropped.stray_triggers) == (1, 1)
    assert expand(items, item_hash, keep_foreign=True).items == items
    assert not expand([USER], item_hash, keep_foreign=False).changed


def crafted(data: bytes) -> str:
    """Content with a valid checksum around ``data`` (the checksum is no secret)."""
    body = base64.urlsafe_b64encode(zlib.compress(data)).rstrip(b"=")
    return f"{PREFIX}{body.decode()}.{_check(body)}"


@pytest.mark.parametrize(
    "data",
    [
        b"\0" * (MAX_PAYLOAD + 1),  # inflates past the bound: stopped there
        orjson.dumps({"v": 1, "summary": "s", "items": "many"}),
        orjson.dumps({"v": 1, "summary": "s", "items": True}),
        orjson.dumps({"v": 1, "summary": 3}),
        orjson.dumps({"v": 1, "summary": "s", "facts": "x"}),
        orjson.dumps({"v": 2, "summary": "s"}),
        orjson.dumps(["not", "an", "object"]),
        b"not json",
    ],
    ids=["bomb", "items", "bool", "summary", "facts", "version", "array", "json"],
)
def test_a_crafted_payload_with_a_valid_checksum_is_a_400_never_a_500(data: bytes):
    with pytest.raises(InvalidRequest):
        decode(crafted(data))
