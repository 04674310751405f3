"""The embedder seam: text to unit vectors, for semantic recall.

A small protocol: :class:`WordLlamaEmbedder` is the real one (the
``wordllama`` package, MIT, whose wheel ships its weights,
``l2_supercat_256.safetensors``, and its tokenizer config: 256 dimensions,
a static token-embedding table averaged over the text, about 0.1 ms a
message on one core); tests use a deterministic fake (tests/fakes/embedder.py).

Nothing is downloaded, ever: the model loads with ``disable_download=True``
from the installed package's own directory (wordllama looks for its tokenizer
under ``tokenizer/`` but ships it under ``tokenizers/``, so the package
directory is passed as the cache directory, whose ``tokenizers/`` it is).
Loading takes about a second, so it happens once, lazily, on a worker
thread (:meth:`WordLlamaEmbedder.load`); ``embed`` is synchronous and
thread-safe, called on a worker thread for stored messages and inline for
one short query.

What is embedded is a message's words without stopwords
(:func:`embedding_text`): averaging a static table over every token lets
"what", "did" and "the" drown the words that carry meaning (measured in
bench/recall.py: the evidence turn is in the top 20 for 27% of LoCoMo
questions with whole texts, 61% with content words).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

# One BLAS thread, set before numpy loads OpenBLAS: a search's matrix-vector
# product (10,000 x 256) runs on the event loop, and OpenBLAS's own threads
# fighting the proxy's for two cores made it 1-6 ms instead of 0.3-0.7
# (bench/recall.py). An operator's own setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np
import numpy.typing as npt

from proxy.context.recall_query import query_terms

Vectors = npt.NDArray[np.float32]

# Words of a stored message that are embedded: enough for any message's meaning.
MAX_WORDS = 512
# The characters of a message looked at (a pasted log must not cost seconds).
MAX_CHARS = 20_000


def embedding_text(text: str, max_words: int = MAX_WORDS) -> str:
    """A message's content words, in order, once each (what the embedder is given)."""
    return " ".join(query_terms(text[:MAX_CHARS], max_terms=max_words))


class Embedder(Protocol):
    """Texts to unit vectors (rows of ``embed``'s result have norm 1, or are all zero)."""

    name: str
    dim: int

    def load(self) -> None:
        """Make ready (may take a while: call off the event loop); idempotent."""
        ...

    @property
    def loaded(self) -> bool: ...

    def embed(self, texts: Sequence[str]) -> Vectors:
        """A (len(texts), dim) float32 array; a text without words gives a zero row."""
        ...


def normalized(vectors: Vectors) -> Vectors:
    """Rows scaled to norm 1; zero (or NaN) rows become zero."""
    vectors = np.nan_to_num(np.asarray(vectors, dtype=np.float32))
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    out: Vectors = np.divide(vectors, norms, out=np.zeros_like(vectors), where=norms > 0)
    return out


class WordLlamaEmbedder:
    """The ``wordllama`` model (``l2_supercat``, 256 dimensions), from its own wheel."""

    name = "wordllama"
    dim = 256

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()
        # Where the weights were read from (the installed package; tests check it).
        self.weights: Path | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def load(self) -> None:
        with self._lock:
            if self._model is not None:
                return
            # wordllama's inference module calls logging.basicConfig() when
            # imported, which would give the root logger a handler of its own:
            # the proxy's logging stays as it was configured.
            root = logging.getLogger()
            handlers, level = list(root.handlers), root.level
            try:
                import wordllama  # type: ignore[import-untyped]
                from wordllama import WordLlama
            finally:
                root.handlers[:] = handlers
                root.setLevel(level)
            package = Path(wordllama.__file__).parent
            model = WordLlama.load(
                "l2_supercat", cache_dir=package, dim=self.dim, disable_download=True
            )
            self.weights = package / "weights" / "l2_supercat_256.safetensors"
            self._model = model

    def embed(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self._model is None:
            self.load()
        # Empty texts pool over no tokens (NaN): a space tokenizes to nothing
        # either, so they are embedded as a placeholder and zeroed after.
        empty = [i for i, t in enumerate(texts) if not t.strip()]
        raw = self._model.embed([t if t.strip() else "." for t in texts], norm=False)
        out = normalized(np.asarray(raw, dtype=np.float32))
        if empty:
            out[empty] = 0.0
        return out


def to_bytes(vector: Vectors) -> bytes:
    """A vector as stored: little-endian float16 (half of float32's size; rankings agree)."""
    return np.asarray(vector, dtype="<f2").tobytes()


def from_bytes(blob: bytes, dim: int) -> Vectors | None:
    """A stored vector, or None when it is not one of ``dim`` dimensions (another model's)."""
    if len(blob) != 2 * dim:
        return None
    return np.frombuffer(blob, dtype="<f2").astype(np.float32)
