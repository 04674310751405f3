"""A deterministic embedder for tests: words that mean the same share a vector.

Each word is mapped to a concept (``SYNONYMS``; any other word is its own),
each concept to a fixed pseudo-random unit vector (from its hash), and a text
to the normalised sum of its words' concepts. So "parcel" and "package",
"shipped" and "delivered" are close without sharing a letter, and the same
text always gives the same vector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from proxy.context.embedder import Vectors, normalized

SYNONYMS = {
    "parcel": "package",
    "package": "package",
    "order": "package",
    "shipped": "deliver",
    "ship": "deliver",
    "deliver": "deliver",
    "delivered": "deliver",
    "delivery": "deliver",
    "send": "deliver",
    "home": "address",
    "address": "address",
    "street": "address",
    "live": "address",
}


def concept(word: str, dim: int) -> Vectors:
    seed = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
    v = np.random.default_rng(seed).standard_normal(dim).astype(np.float32)
    out: Vectors = v / np.linalg.norm(v)
    return out


class FakeEmbedder:
    name = "fake"

    def __init__(self, dim: int = 32, *, fail: bool = False) -> None:
        self.dim = dim
        self.fail = fail
        self.calls: list[list[str]] = []
        self._loaded = False

    @property
    def loaded(self) -> bool:
        return self._loaded

    def load(self) -> None:
        self._loaded = True

    def embed(self, texts: Sequence[str]) -> Vectors:
        if self.fail:
            raise RuntimeError("the model is broken")
        self.calls.append(list(texts))
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                out[i] += concept(SYNONYMS.get(word, word), self.dim)
        return normalized(out)
