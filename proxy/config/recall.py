"""Config for recall: the ``recall:`` block of a trim or summarize policy.

Read by proxy/config/loader.py and proxy/config/summarize.py; every error names
the path of the bad key (``policies.support.recall.share: must be > 0 and <= 0.9, got 1.5``).
"""

from __future__ import annotations

from policies.types import SEMANTIC_WEIGHT, RecallSpec
from proxy.config.node import Node
from proxy.errors import ConfigError

RECALL_KEYS = frozenset(
    {"max_tokens", "share", "neighbors", "embeddings", "candidates", "semantic_weight", "expand"}
)
# none: lexical search only; wordllama: lexical and semantic (proxy/context/embedder.py).
EMBEDDINGS = ("none", "wordllama")


def recall_spec(node: Node, *, has_budget: bool) -> RecallSpec | None:
    """The policy's ``recall:`` block; None when it has none.

    ``has_budget``: whether the policy has a token budget a ``share`` can be of.
    """
    if node.raw("recall") is None:
        return None
    node = node.child("recall", set(RECALL_KEYS))
    max_tokens = node.integer("max_tokens", minimum=16)
    share = node.number("share", high=0.9)
    if max_tokens is not None and share is not None:
        raise ConfigError(node.at("share"), "give max_tokens or share, not both")
    if share is not None and not has_budget:
        raise ConfigError(
            node.at("share"), "needs a token budget in the policy (max_tokens or context_fraction)"
        )
    if max_tokens is None and share is None:
        if not has_budget:
            raise ConfigError(node.path, "needs max_tokens (the policy has no token budget)")
        share = 0.3
    embeddings = node.text("embeddings", "none") or "none"
    if embeddings not in EMBEDDINGS:
        raise ConfigError(
            node.at("embeddings"), f"must be one of {', '.join(EMBEDDINGS)}; got {embeddings!r}"
        )
    # 0 is allowed (lexical order, semantic hits after): number() wants > low.
    weight = node.number("semantic_weight", low=-1e9)
    if weight is not None and not 0.0 <= weight <= 1.0:
        raise ConfigError(node.at("semantic_weight"), f"must be >= 0 and <= 1, got {weight}")
    if weight is not None and embeddings == "none":
        raise ConfigError(node.at("semantic_weight"), "needs embeddings: wordllama")
    neighbors = node.integer("neighbors", 2, minimum=0)
    candidates = node.integer("candidates", 40, minimum=1)
    assert neighbors is not None and candidates is not None  # they have defaults
    if neighbors > 5:
        raise ConfigError(node.at("neighbors"), f"must be <= 5, got {neighbors}")
    if candidates > 500:
        raise ConfigError(node.at("candidates"), f"must be <= 500, got {candidates}")
    expand = node.raw("expand")
    if expand is not None and not isinstance(expand, bool):
        raise ConfigError(node.at("expand"), f"must be true or false, got {expand!r}")
    return RecallSpec(
        expand=bool(expand),
        max_tokens=max_tokens,
        share=share,
        neighbors=neighbors,
        embeddings=embeddings,
        candidates=candidates,
        semantic_weight=SEMANTIC_WEIGHT if weight is None else weight,
    )
