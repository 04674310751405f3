"""Request bodies sent compressed (``Content-Encoding``), decoded within the body limit.

Codex zstd-compresses its request bodies under ChatGPT sign-in (Codex Desktop
the large ones), other SDKs send gzip: a body the proxy parses is decoded
first, whatever its endpoint. Pass-through endpoints relay the bytes as they
came (proxy/passthrough/relay.py) and decode only to read a model to route by.

- Codings: ``zstd``, ``gzip`` (``x-gzip``), ``deflate`` (zlib-wrapped, or
  raw deflate as some clients send it), ``br``, ``identity``. Stacked ones
  (``Content-Encoding: gzip, br``: gzip applied first, then br) are undone
  in reverse order.
- The body limit (``server.max_body_bytes``) applies to the decoded bytes,
  and to each stage's output of a stacked encoding: every decoder is asked
  for at most what is left of the limit plus one byte, so a decompression
  bomb (1 GiB of zeros is 32 KiB of zstd) is refused with a 413 once the
  limit is passed, never inflated (memory: the limit, not the bomb).
- An unknown coding is a 415 (``unsupported_content_encoding``), a corrupt
  or truncated stream a 400 (``invalid_content_encoding``), both in OpenAI's
  error shape. The decoded body replaces the raw one: what is forwarded
  upstream carries no Content-Encoding (proxy/http/body.py ``forward_headers``).

Libraries: zlib (stdlib), ``brotli`` (Google's bindings), ``backports.zstd``
(the stdlib's ``compression.zstd`` of Python 3.14, from 3.14 on the stdlib
module itself): its decompressor has a ``max_length`` and says when a frame
ended, so a truncated stream is told from a complete one.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable

import brotli

from proxy.errors import CorruptEncoding, PayloadTooLarge, UnsupportedEncoding

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

SUPPORTED = ("zstd", "gzip", "deflate", "br")
# Codings that leave the bytes as they are.
_IDENTITY = frozenset({"identity", ""})
_GZIP_MAGIC = b"\x1f\x8b"


def codings(header: str) -> list[str]:
    """The codings of a Content-Encoding value, in the order they were applied."""
    found = [c.strip().lower() for c in header.split(",")]
    return [c for c in found if c not in _IDENTITY]


def decode(raw: bytes, header: str, limit: int) -> bytes:
    """``raw`` with every coding of ``header`` undone, at most ``limit`` bytes at each stage.

    Raises :class:`UnsupportedEncoding` (415), :class:`CorruptEncoding` (400) or
    :class:`~proxy.errors.PayloadTooLarge` (413, decoding stopped at the limit).
    """
    applied = codings(header)
    stages: list[tuple[str, Callable[[bytes, int], bytes]]] = []
    for name in applied:
        decoder = _DECODERS.get("gzip" if name == "x-gzip" else name)
        if decoder is None:
            raise UnsupportedEncoding(
                f"The request body's Content-Encoding {name!r} is not supported; "
                f"send it as {', '.join(SUPPORTED)} or uncompressed.",
                param="Content-Encoding",
            )
        stages.append((name, decoder))
    data = raw
    for name, decoder in reversed(stages):
        try:
            data = decoder(data, limit)
        except (zlib.error, zstd.ZstdError, brotli.error, EOFError) as exc:
            raise _corrupt(name, str(exc)) from None
    return data


def _corrupt(name: str, detail: str) -> CorruptEncoding:
    return CorruptEncoding(
        f"The request body is not valid {name} data ({detail}).", param="Content-Encoding"
    )


def _grow(out: bytearray, chunk: bytes, limit: int) -> None:
    """``out`` with ``chunk`` added; past ``limit`` the body is refused (and left undecoded)."""
    out += chunk
    if len(out) > limit:
        raise PayloadTooLarge(f"The request body exceeds the limit of {limit} bytes once decoded.")


def _zlib(raw: bytes, limit: int, wbits: int, name: str) -> bytes:
    """A zlib-family stream (gzip members follow one another: each is decoded)."""
    out = bytearray()
    d = zlib.decompressobj(wbits)
    data = raw
    while True:
        # max_length 0 would mean "no limit": the room left is always >= 1 here.
        chunk = d.decompress(data, limit + 1 - len(out))
        _grow(out, chunk, limit)
        if d.eof:
            rest = d.unused_data
            if not rest:
                return bytes(out)
            if name == "gzip" and rest.startswith(_GZIP_MAGIC):
                d, data = zlib.decompressobj(wbits), rest
                continue
            raise _corrupt(name, "data after the end of the stream")
        data = d.unconsumed_tail
        if not data and not chunk:
            raise _corrupt(name, "the stream ends before its end")


def _gzip(raw: bytes, limit: int) -> bytes:
    return _zlib(raw, limit, 16 + zlib.MAX_WBITS, "gzip")


def _deflate(raw: bytes, limit: int) -> bytes:
    # HTTP's deflate is the zlib format; some clients send raw deflate. A zlib
    # header is two bytes whose big-endian value is a multiple of 31, method 8.
    wrapped = len(raw) >= 2 and raw[0] & 0x0F == 8 and (raw[0] << 8 | raw[1]) % 31 == 0
    return _zlib(raw, limit, zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS, "deflate")


def _zstd(raw: bytes, limit: int) -> bytes:
    """Every frame of a zstd stream (skippable frames are passed over by the library)."""
    out = bytearray()
    d = zstd.ZstdDecompressor()
    data = raw
    while True:
        chunk = d.decompress(data, limit + 1 - len(out))
        data = b""
        _grow(out, chunk, limit)
        if d.eof:
            rest = d.unused_data
            if not rest:
                return bytes(out)
            d, data = zstd.ZstdDecompressor(), rest
        elif d.needs_input:
            raise _corrupt("zstd", "the stream ends before its end")


def _brotli(raw: bytes, limit: int) -> bytes:
    out = bytearray()
    d = brotli.Decompressor()
    chunk = d.process(raw, output_buffer_limit=limit + 1)
    while True:
        _grow(out, chunk, limit)
        if d.is_finished():
            return bytes(out)
        if d.can_accept_more_data():
            raise _corrupt("br", "the stream ends before its end")
        chunk = d.process(b"", output_buffer_limit=limit + 1 - len(out))


_DECODERS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": _gzip,
    "deflate": _deflate,
    "zstd": _zstd,
    "br": _brotli,
}
