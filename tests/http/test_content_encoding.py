"""The Content-Encoding decoder itself: round trips, stacked codings, the limit's edge."""

from __future__ import annotations

import gzip
import sys
import zlib
from collections.abc import Callable

import brotli
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.errors import CorruptEncoding, PayloadTooLarge, UnsupportedEncoding
from proxy.http.content_encoding import codings, decode

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

ENCODE: dict[str, Callable[[bytes], bytes]] = {
    "zstd": zstd.compress,
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "br": brotli.compress,
}


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=4096),
    applied=st.lists(st.sampled_from(sorted(ENCODE)), min_size=1, max_size=3),
)
def test_any_stack_of_codings_round_trips(data, applied):
    body = data
    for name in applied:  # in the order the header lists them: the first applied first
        body = ENCODE[name](body)
    assert decode(body, ", ".join(applied), 1 << 20) == data


@pytest.mark.parametrize("name", sorted(ENCODE))
def test_the_limit_is_on_the_decoded_bytes_to_the_byte(name):
    data = b"y" * 5000
    body = ENCODE[name](data)
    assert decode(body, name, 5000) == data
    with pytest.raises(PayloadTooLarge):
        decode(body, name, 4999)


def test_gzip_members_one_after_another_are_one_body():
    assert decode(gzip.compress(b"ab") + gzip.compress(b"cd"), "gzip", 100) == b"abcd"


def test_zstd_frames_one_after_another_are_one_body():
    assert decode(zstd.compress(b"ab") + zstd.compress(b"cd"), "zstd", 100) == b"abcd"


def test_data_after_a_deflate_stream_is_corrupt():
    with pytest.raises(CorruptEncoding):
        decode(zlib.compress(b"ab") + b"junk", "deflate", 100)


def test_identity_and_blank_entries_are_no_coding():
    assert codings("identity") == []
    assert codings(" GZip , , br ") == ["gzip", "br"]
    assert decode(b"plain", "identity", 10) == b"plain"


def test_an_unknown_coding_anywhere_in_a_stack_is_unsupported():
    with pytest.raises(UnsupportedEncoding) as info:
        decode(gzip.compress(b"x"), "gzip, lzma", 100)
    assert info.value.status == 415
    assert "'lzma'" in info.value.message
