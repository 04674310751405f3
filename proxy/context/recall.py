"""Recall on the request path: search the session's index, let the policy pick, report.

The policy ran with its budget minus the recall reserve (Rewriter.budget);
this step asks the recall index for the stored turns that match the newest
user message (only those older than the last message the policy left out),
checks that each hit is the very message at that position of this request
(same content hash), and hands the hits to :func:`policies.recall.recall`.

With ``embeddings: wordllama`` the newest user message is also embedded
(inline: its content words, a fraction of a millisecond) and compared with
the session's stored vectors (proxy/context/semantic.py: cached, loaded by
cursor), and the two rankings are fused (policies/fusion.py) before the
policy picks. Messages not embedded yet are still found lexically; a model
still loading, or a vector error, leaves the request with lexical recall
(``semantic`` in the row says which).

Never fails a request: an index error (a locked or corrupt database, a
missing table, a backend that cannot search) serves the request without
recall, marked ``error`` in the header, the row, the log line and the
metrics. No work at all for policies without a ``recall:`` block.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from policies.fusion import fuse
from policies.items import recallable
from policies.modes import latest_user_text
from policies.recall import Hit, Recalled, Shape, line_message, recall
from policies.transcript import message_text
from policies.types import CountFn, Decision, Message, RecallSpec
from proxy.context.recall_memo import RecallMemo, result_of
from proxy.context.recall_query import expansion_terms, query_terms, words_of
from proxy.context.tokens import TiktokenCounter
from proxy.store.base import SessionRef
from proxy.store.search import RecallIndex
from proxy.telemetry.logging import get_logger
from proxy.telemetry.metrics import Metrics

if TYPE_CHECKING:  # numpy and the model load only where a policy asks for embeddings
    from proxy.context.embeddings import Embeddings
    from proxy.context.semantic import Near

log = get_logger()

# Nearest vectors fused with the lexical hits, at most (and at most ``candidates``):
# as many as lexical hits. Recall scores units (policies/recall.py), so a semantic
# hit's neighbors only come back when they score (bench/recall.py, LoCoMo, share
# 0.8, at 10% / 25%: 76.9% / 86.6% kept with 5, 77.3% / 87.3% with 10,
# 78.8% / 87.1% with 20, 79.5% / 87.6% with 40; 76.4% / 84.3% lexical only).
SEMANTIC_CANDIDATES = 40

# ``expand: true``: lexical recall searches again with the words of its best
# hits (pseudo-relevance feedback: the second hop of a multi-hop question), at a
# share of their score (bench/recall.py, LoCoMo, share 0.8, at 10% / 25%: 76.2%
# / 85.9% against 76.4% / 84.3%; 2 hits at 0.15: 75.9 / 85.9, at 0.25: 75.9 /
# 85.4; 1 or 3 hits at 0.15: 75.7 / 85.2, 75.9 / 85.9). Not with embeddings:
# fused, it keeps up to 1.5 points less (measured on a replica).
EXPANSION_HITS = 2
EXPANSION_WEIGHT = 0.1

# Sessions whose left-out messages' lines were counted ahead (RecallService.prepare),
# each with the highest position counted; lines built and counted at a time.
PREPARED_SESSIONS = 4096
PREPARE_CHUNK = 256

# Values of X-Context-Recall and the row's recall.status.
RECALLED, NONE, ERROR, NO_SESSION, UNSUPPORTED = (
    "recalled",
    "none",
    "error",
    "no_session",
    "unsupported",
)


@dataclass
class RecallOutcome:
    """What recall did for one request (header, row, log line, metrics)."""

    status: str
    recalled: Recalled = field(default_factory=Recalled)
    budget: int = 0
    terms: int = 0
    candidates: int = 0
    ms: float = 0.0
    error: str | None = None
    # The item ids of the recalled hits with their scores, best first.
    items: list[tuple[int | None, float]] = field(default_factory=list)
    # Semantic search: None (lexical only), "used", "loading" (the model is
    # not loaded yet), "no_vectors", "error"; the vectors compared, its time.
    semantic: str | None = None
    vectors: int = 0
    semantic_ms: float = 0.0
    semantic_error: str | None = None
    # Whether this exchange's messages are to be embedded once stored.
    embed: bool = False

    def detail(self) -> dict[str, Any]:
        """The request row's ``recall`` entry: bounded by the recall budget, not the session."""
        r = self.recalled
        out: dict[str, Any] = {
            "status": self.status,
            "turns": r.turns,
            "messages": r.messages,
            "tokens": r.tokens,
            "budget": self.budget,
            "spans": [list(s) for s in r.spans],
            "hits": [[h.index, h.item_id, round(h.score, 4)] for h in r.hits],
            "terms": self.terms,
            "candidates": self.candidates,
            "ms": round(self.ms, 3),
        }
        if r.position is not None:
            out["position"] = r.position
        if self.semantic is not None:
            out["semantic"] = self.semantic
            out["vectors"] = self.vectors
            out["semantic_ms"] = round(self.semantic_ms, 3)
            if self.semantic_error is not None:
                out["semantic_error"] = self.semantic_error
        if self.error is not None:
            out["error"] = self.error
        return out


def _system_words(conversation: Sequence[Message]) -> frozenset[str]:
    """Words of the leading system and developer messages: always forwarded, so a
    query term from them (the assistant's or the user's name, the product) only
    finds the turns that repeat them."""
    texts: list[str] = []
    for message in conversation[:4]:
        if message.get("role") not in ("system", "developer"):
            break
        texts.append(message_text(message)[:4000])
    return _words_of_texts(tuple(texts))


# A session resends the same system prompt on every request: its words are
# found once (bounded: a few prompts per route, a few routes).
@functools.lru_cache(maxsize=256)
def _words_of_texts(texts: tuple[str, ...]) -> frozenset[str]:
    out: set[str] = set()
    for text in texts:
        out |= words_of(text)
    return frozenset(out)


class _Found(Protocol):
    """A search or vector hit: a stored item at a position of the session's chain."""

    @property
    def position(self) -> int: ...
    @property
    def score(self) -> float: ...
    @property
    def item_id(self) -> int | None: ...
    @property
    def content_hash(self) -> str: ...


def _candidates(
    found: Sequence[_Found], conversation: Sequence[Message], hashes: Sequence[str]
) -> list[Hit]:
    """The hits that are this request's message at that position (a stored item of
    another branch, or a position this request does not have, is not) and a turn:
    never the proxy's own expanded summary or a compaction item (they stand for
    turns that are themselves recallable)."""
    n = len(conversation)
    return [
        Hit(h.position, h.score, h.item_id)
        for h in found
        if h.position < n
        and hashes[h.position] == h.content_hash
        and recallable(conversation[h.position])
    ]


class RecallService:
    def __init__(
        self,
        index: RecallIndex | None,
        metrics: Metrics,
        embeddings: Embeddings | None = None,
        versions: Callable[[SessionRef], int | None] | None = None,
    ) -> None:
        self._index = index
        self._metrics = metrics
        # None: no semantic recall (no embedder, or a store without a vector index).
        self.embeddings = embeddings
        # The version of a session's stored items, where the store knows it (None:
        # a backend that cannot say, shared by other instances): the memo's guard.
        self._versions = versions
        self.memo = RecallMemo()
        self._prepared: OrderedDict[tuple[str, str], int] = OrderedDict()

    async def apply(
        self,
        *,
        policy: str,
        spec: RecallSpec,
        budget: int,
        ref: SessionRef | None,
        conversation: Sequence[Message],
        hashes: Sequence[str] | None,
        decision: Decision,
        count: CountFn,
        sizes: Sequence[int] | None = None,
        shape: Shape | None = None,
        model: str | None = None,
    ) -> tuple[Decision, RecallOutcome]:
        """``decision`` with recalled turns added (within ``budget`` tokens), and the outcome.

        ``sizes``: the conversation's token counts by position, when known;
        ``shape``: its units when they are not chat messages (Responses items);
        ``model``: the one ``count`` counts for (chat messages with a model: the
        outcome is memoized, proxy/context/recall_memo.py).
        """
        started = time.perf_counter()
        outcome = RecallOutcome(status=NONE, budget=budget)
        outcome.embed = spec.embeddings != "none" and self.embeddings is not None
        try:
            if ref is None or hashes is None:
                outcome.status = NO_SESSION
            elif self._index is None:
                outcome.status = UNSUPPORTED
            elif decision.dropped and budget > 0:
                key = self._memo_key(spec, budget, ref, hashes, decision, model, shape)
                again = self._remembered(ref, key, decision, conversation, outcome)
                if again is not None:
                    decision = again
                else:
                    decision = await self._recall(
                        spec,
                        budget,
                        ref,
                        conversation,
                        hashes,
                        decision,
                        count,
                        sizes,
                        outcome,
                        shape,
                    )
                    if key is not None:
                        self._remember(ref, key, decision, conversation, outcome, len(hashes))
        except Exception as exc:  # recall must never fail a request (see above)
            outcome.status = ERROR
            outcome.error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("recall_failed", policy=policy, error=outcome.error)
        outcome.ms = (time.perf_counter() - started) * 1000
        self._observe(policy, outcome)
        return decision, outcome

    async def prepare(
        self,
        ref: SessionRef,
        conversation: Sequence[Message],
        decision: Decision,
        counter: TiktokenCounter,
    ) -> int:
        """Off the request path (the chat pipeline spawns it): count the recall lines
        of the chat messages ``decision`` left out that no request of the session had
        left out before, into ``counter``'s cache, so the block that first quotes
        them counts no line on its request's path (the same count: the same
        message). Returns the lines tokenized."""
        key = (ref.tenant, ref.key)
        done = self._prepared.get(key, -1)
        todo = [i for i in decision.dropped if i > done]
        if not todo:
            return 0
        self._prepared[key] = todo[-1]
        self._prepared.move_to_end(key)
        while len(self._prepared) > PREPARED_SESSIONS:
            self._prepared.popitem(last=False)
        counted = 0
        for start in range(0, len(todo), PREPARE_CHUNK):
            lines = [line_message(conversation, i) for i in todo[start : start + PREPARE_CHUNK]]
            counted += await counter.precount_messages([m for m in lines if m is not None])
        return counted

    def _remembered(
        self,
        ref: SessionRef,
        key: Hashable | None,
        decision: Decision,
        conversation: Sequence[Message],
        outcome: RecallOutcome,
    ) -> Decision | None:
        """What recall gave the same request over the same items (None: not memoized)."""
        found = self.memo.get(ref, key) if key is not None else None
        again = found.applied(decision, conversation) if found is not None else None
        if found is None or again is None:
            return None
        outcome.status, outcome.recalled = found.status, found.recalled
        outcome.terms, outcome.candidates = found.terms, found.candidates
        outcome.semantic = found.semantic
        return again

    def _remember(
        self,
        ref: SessionRef,
        key: Hashable,
        decision: Decision,
        conversation: Sequence[Message],
        outcome: RecallOutcome,
        hashes: int,
    ) -> None:
        result = result_of(
            outcome.recalled,
            decision,
            conversation,
            status=outcome.status,
            terms=outcome.terms,
            candidates=outcome.candidates,
            semantic=outcome.semantic,
        )
        self.memo.put(ref, key, result, hashes)

    def _memo_key(
        self,
        spec: RecallSpec,
        budget: int,
        ref: SessionRef,
        hashes: Sequence[str],
        decision: Decision,
        model: str | None,
        shape: Shape | None,
    ) -> Hashable | None:
        """What this request's recall depends on; None: not memoized (semantic recall,
        Responses items, a store that cannot say when the session's items changed)."""
        if self._versions is None or model is None or shape is not None:
            return None
        if spec.embeddings != "none" and self.embeddings is not None:
            return None
        version = self._versions(ref)
        if version is None:
            return None
        return RecallMemo.key(version, spec, budget, model, hashes, decision)

    async def _recall(
        self,
        spec: RecallSpec,
        budget: int,
        ref: SessionRef,
        conversation: Sequence[Message],
        hashes: Sequence[str],
        decision: Decision,
        count: CountFn,
        sizes: Sequence[int] | None,
        outcome: RecallOutcome,
        shape: Shape | None = None,
    ) -> Decision:
        assert self._index is not None
        text = latest_user_text(conversation)
        terms = query_terms(text, exclude=_system_words(conversation))
        outcome.terms = len(terms)
        before = decision.dropped[-1] + 1
        semantic = spec.embeddings != "none" and self.embeddings is not None
        if spec.embeddings != "none" and self.embeddings is None:
            outcome.semantic = "unsupported"  # a store without a vector index
        if not terms and not semantic:
            return decision
        found = (
            await self._index.search(ref, terms, limit=spec.candidates, before=before)
            if terms
            else []
        )
        near = await self._semantic(spec, ref, terms, text, before, outcome) if semantic else []
        hits = _candidates(found, conversation, hashes)
        if spec.expand and outcome.semantic != "used" and hits:
            hits = await self._expand(spec, ref, conversation, hashes, terms, hits, before)
        if outcome.semantic == "used":
            hits = fuse(hits, _candidates(near, conversation, hashes), spec.semantic_weight)
        outcome.candidates = len(hits)
        decision, outcome.recalled = recall(
            conversation,
            decision,
            hits,
            count,
            budget,
            neighbors=spec.neighbors,
            sizes=sizes,
            shape=shape,
        )
        if outcome.recalled.spans:
            outcome.status = RECALLED
        return decision

    async def _expand(
        self,
        spec: RecallSpec,
        ref: SessionRef,
        conversation: Sequence[Message],
        hashes: Sequence[str],
        terms: Sequence[str],
        hits: list[Hit],
        before: int,
    ) -> list[Hit]:
        """``hits`` with a second search's: the words of the best hits, at
        :data:`EXPANSION_WEIGHT` of their score."""
        assert self._index is not None
        best = sorted(hits, key=lambda h: (-h.score, -h.index))[:EXPANSION_HITS]
        texts = [message_text(conversation[h.index]) for h in best]
        words = expansion_terms(texts, terms, exclude=_system_words(conversation))
        if not words:
            return hits
        found = await self._index.search(ref, words, limit=spec.candidates, before=before)
        merged = {h.index: h for h in hits}
        for h in _candidates(found, conversation, hashes):
            was = merged.get(h.index)
            score = EXPANSION_WEIGHT * h.score + (was.score if was is not None else 0.0)
            merged[h.index] = Hit(h.index, score, h.item_id)
        out = sorted(merged.values(), key=lambda h: (-h.score, -h.index))
        return out[: spec.candidates]

    async def _semantic(
        self,
        spec: RecallSpec,
        ref: SessionRef,
        terms: Sequence[str],
        text: str,
        before: int,
        outcome: RecallOutcome,
    ) -> list[Near]:
        """The stored messages closest in meaning; [] (lexical only) on any trouble."""
        embeddings = self.embeddings
        assert embeddings is not None
        started = time.perf_counter()
        try:
            if not embeddings.ready:
                embeddings.start()
                outcome.semantic = "loading"
                return []
            # The content words, as the stored messages were embedded; the system
            # prompt's words are left out as for the lexical query.
            query = embeddings.query(" ".join(terms) if terms else text)
            vectors = await embeddings.cache.get(ref)
            if query is None or vectors is None or vectors.count == 0:
                outcome.semantic = "no_vectors"
                return []
            outcome.vectors = vectors.count
            near = vectors.nearest(query, min(spec.candidates, SEMANTIC_CANDIDATES), before)
            outcome.semantic = "used"
            return near
        except Exception as exc:  # lexical recall goes on without it
            outcome.semantic = "error"
            outcome.semantic_error = f"{type(exc).__name__}: {exc}"[:300]
            log.warning("semantic_recall_failed", error=outcome.semantic_error)
            return []
        finally:
            outcome.semantic_ms = (time.perf_counter() - started) * 1000

    def _observe(self, policy: str, outcome: RecallOutcome) -> None:
        m = self._metrics
        m.recall.inc((policy, outcome.status))
        m.recall_seconds.observe((policy,), outcome.ms / 1000)
        if outcome.recalled.spans:
            m.recalled_turns.inc((policy,), outcome.recalled.turns)
            m.recall_tokens.inc((policy,), outcome.recalled.tokens)
