"""What Anthropic charges for an image or a PDF, in input tokens, read off the block.

Images (https://docs.anthropic.com/en/docs/build-with-claude/vision): about
``width * height / 750`` tokens, after an image whose long edge passes 1,568 px is
scaled down to it, and never more than about 1,600. The size is read from the
image's own header (PNG, GIF, WebP, JPEG) in the first bytes of its base64 data;
an image the proxy cannot size (a URL, a file id, an unknown format) is priced at
the most an image costs, so a budget is never overrun by one.

PDFs: every page is read as text and as an image; a page is priced at
:data:`PDF_PAGE` tokens (an image's most, and a page of text), times the pages
counted in the document. Each is priced once per content (a small memo: a
conversation resends its media every turn).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

MAX_EDGE = 1568
IMAGE_MAX = 1600
PDF_PAGE = 3100
# How much of an image's base64 is decoded to find its size (JPEG's can sit after EXIF).
_HEAD_CHARS = 96 * 1024
_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
_MEMO: OrderedDict[tuple[str, int, str, str], int] = OrderedDict()
_MEMO_SIZE = 256


def image_tokens(block: Mapping[str, Any]) -> int:
    """An image block's price (Anthropic's formula over its size)."""
    source = block.get("source")
    data = source.get("data") if isinstance(source, Mapping) else None
    if not isinstance(data, str):
        return IMAGE_MAX
    return _memo(data, _image_price)


def _image_price(data: str) -> int:
    size = image_size(_head(data))
    if size is None or not all(size):
        return IMAGE_MAX
    width, height = size
    scale = min(1.0, MAX_EDGE / max(width, height))
    return min(IMAGE_MAX, max(1, math.ceil(width * scale * height * scale / 750)))


def document_tokens(block: Mapping[str, Any]) -> int:
    """A base64 PDF's price (its pages); other documents are counted as their text."""
    source = block.get("source")
    data = source.get("data") if isinstance(source, Mapping) else None
    if not isinstance(data, str):
        return PDF_PAGE  # a URL or file id: one page, at least
    return _memo(data, _pdf_price)


def _pdf_price(data: str) -> int:
    try:
        raw = base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        raw = b""
    return max(1, len(_PAGE.findall(raw))) * PDF_PAGE


def _memo(data: str, price: Callable[[str], int]) -> int:
    """``price(data)``, once per content (a conversation resends its media every turn)."""
    key = (price.__name__, len(data), data[:64], data[-64:])
    tokens = _MEMO.get(key)
    if tokens is None:
        tokens = _MEMO[key] = price(data)
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return tokens


def _head(data: str) -> bytes:
    head = data[:_HEAD_CHARS]
    head = head[: len(head) - len(head) % 4]
    try:
        return base64.b64decode(head, validate=False)
    except (binascii.Error, ValueError):
        return b""


def image_size(raw: bytes) -> tuple[int, int] | None:
    """(width, height) from a PNG, GIF, WebP or JPEG header; None when not found."""
    if raw.startswith(b"\x89PNG\r\n\x1a\n") and len(raw) >= 24:
        return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")
    if raw[:4] in (b"GIF8",) and len(raw) >= 10:
        return int.from_bytes(raw[6:8], "little"), int.from_bytes(raw[8:10], "little")
    if raw[:4] == b"RIFF" and raw[8:12] == b"WEBP":
        return _webp(raw)
    if raw[:2] == b"\xff\xd8":
        return _jpeg(raw)
    return None


def _webp(raw: bytes) -> tuple[int, int] | None:
    chunk = raw[12:16]
    if chunk == b"VP8 " and len(raw) >= 30:
        return (
            int.from_bytes(raw[26:28], "little") & 0x3FFF,
            int.from_bytes(raw[28:30], "little") & 0x3FFF,
        )
    if chunk == b"VP8L" and len(raw) >= 25:
        b = raw[21:25]
        return 1 + (((b[1] & 0x3F) << 8) | b[0]), 1 + (
            ((b[3] & 0xF) << 10) | (b[2] << 2) | ((b[1] & 0xC0) >> 6)
        )
    if chunk == b"VP8X" and len(raw) >= 30:
        return 1 + int.from_bytes(raw[24:27], "little"), 1 + int.from_bytes(raw[27:30], "little")
    return None


# JPEG start-of-frame markers (C0-CF but DHT C4, JPG C8, DAC CC): they carry the size.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(raw: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(raw):
        if raw[i] != 0xFF:
            return None
        marker = raw[i + 1]
        if marker == 0xFF:
            i += 1  # fill byte
            continue
        if marker in _SOF:
            height = int.from_bytes(raw[i + 5 : i + 7], "big")
            width = int.from_bytes(raw[i + 7 : i + 9], "big")
            return (width, height) if width and height else None
        i += 2 + int.from_bytes(raw[i + 2 : i + 4], "big")
    return None
