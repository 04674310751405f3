"""Images and PDFs priced by Anthropic's rules (proxy/messages/media.py), and what the
chat view hands the counter for them."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any

import pytest

from proxy.context.tokens import counter_for
from proxy.messages.media import IMAGE_MAX, PDF_PAGE, document_tokens, image_size, image_tokens
from proxy.messages.view import chat_view


def png(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(ihdr))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
    )


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00"


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHH", 17, 8, height, width) + b"\x03" + b"\x00" * 9
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def webp(width: int, height: int) -> bytes:
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    vp8x += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x


def image_block(data: bytes, media_type: str = "image/png") -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": encoded},
    }


@pytest.mark.parametrize("make", [png, gif, jpeg, webp])
def test_an_images_size_is_read_from_its_header(make: Any) -> None:
    assert image_size(make(640, 480)) == (640, 480)


def test_an_image_costs_its_pixels_over_750_scaled_to_a_1568_edge_and_capped() -> None:
    assert image_tokens(image_block(png(200, 200))) == 54  # 40,000 / 750, rounded up
    assert image_tokens(image_block(jpeg(1000, 1000), "image/jpeg")) == 1334
    # 3136 x 784: scaled to 1568 x 392 = 819.5 tokens, rounded up.
    assert image_tokens(image_block(png(3136, 784))) == 820
    assert image_tokens(image_block(png(4000, 4000))) == IMAGE_MAX


def test_an_image_the_proxy_cannot_size_costs_the_most_an_image_can() -> None:
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    assert image_tokens(url) == IMAGE_MAX
    assert image_tokens(image_block(b"not an image at all")) == IMAGE_MAX


def test_a_pdf_costs_its_pages() -> None:
    pages = b"".join(b"%d 0 obj << /Type /Page /Parent 1 0 R >> endobj\n" % i for i in range(3))
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 3 >> endobj\n" + pages + b"%%EOF"
    block = {
        "type": "document",
        "source": {
            "type": "base64",
            "media_type": "application/pdf",
            "data": base64.b64encode(pdf).decode(),
        },
    }
    assert document_tokens(block) == 3 * PDF_PAGE


def test_the_counter_prices_a_messages_images_and_text_documents_as_anthropic_does() -> None:
    text = "the contract says the fee is forty euros " * 20
    body = {
        "messages": [
            {
                "role": "user",
                "content": [
                    image_block(png(200, 200)),
                    {"type": "document", "source": {"type": "text", "data": text}},
                    {"type": "text", "text": "Summarise."},
                ],
            }
        ]
    }
    counter = counter_for("claude-fake-1")
    with_media = counter.count_message(chat_view(body)[0])
    body["messages"][0]["content"] = body["messages"][0]["content"][2:]
    without = counter.count_message(chat_view(body)[0])
    assert with_media - without == 54 + counter.count_message({"content": text}) - 3
