"""The real embedder (wordllama) loads from its own wheel with no network, and means something."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from proxy.context.embedder import (
    WordLlamaEmbedder,
    embedding_text,
    from_bytes,
    to_bytes,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_model_loads_with_the_network_unavailable_from_the_installed_package():
    # In a fresh interpreter: hub access off, and any socket use refused.
    script = textwrap.dedent(
        """
        import socket, sys
        def refuse(*args, **kwargs):
            raise OSError("network disabled in this test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        sys.path.insert(0, sys.argv[1])
        import wordllama
        from pathlib import Path
        from proxy.context.embedder import WordLlamaEmbedder
        e = WordLlamaEmbedder()
        e.load()
        v = e.embed(["delivery address"])
        assert v.shape == (1, 256), v.shape
        package = Path(wordllama.__file__).parent
        assert e.weights is not None and e.weights.is_file()
        assert e.weights.parent.parent == package, (e.weights, package)
        print("ok", e.weights)
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HOME": "/nonexistent-home"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(REPO)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("ok ") and "site-packages/wordllama/weights" in out.stdout


def test_loading_leaves_the_root_logger_as_it_was():
    import logging

    root = logging.getLogger()
    before = list(root.handlers), root.level
    WordLlamaEmbedder().load()
    assert (list(root.handlers), root.level) == before


def test_a_paraphrase_is_closer_than_an_unrelated_message_and_empty_texts_are_zero():
    e = WordLlamaEmbedder()
    q, same, other, empty = e.embed(
        [
            embedding_text("Where should the parcel be shipped?"),
            embedding_text("Please deliver my package to 17 Quai des Celestins, Lyon."),
            embedding_text("I went hiking in the mountains last weekend."),
            "",
        ]
    )
    assert float(q @ same) > float(q @ other) + 0.05
    assert abs(float(np.linalg.norm(q)) - 1) < 1e-5
    assert not empty.any()


def test_vectors_are_stored_as_float16_and_read_back():
    v = WordLlamaEmbedder().embed(["hello there"])[0]
    blob = to_bytes(v)
    assert len(blob) == 512
    back = from_bytes(blob, 256)
    assert back is not None and float(back @ v) > 0.999
    assert from_bytes(blob, 128) is None


def test_embedding_text_keeps_the_words_that_carry_meaning():
    assert embedding_text("What is the address where I live?") == "address live"
