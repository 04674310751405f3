"""expand: true: lexical recall searches again with the words of its best hits."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from policies.trim import trim
from policies.types import Budget, RecallSpec, TrimSpec
from proxy.context.recall import RecallService
from proxy.context.recall_query import expansion_terms
from proxy.store.base import SessionRef
from proxy.store.search import SearchHit
from proxy.telemetry.metrics import Metrics
from tests.policies.test_properties import simple_count


class WordIndex:
    """A fake recall index: the messages holding any of the terms, by how many they hold."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages
        self.searches: list[list[str]] = []

    async def search(
        self, session: SessionRef, terms: Sequence[str], *, limit: int, before: int | None = None
    ) -> list[SearchHit]:
        self.searches.append(list(terms))
        hits = []
        for i, m in enumerate(self.messages[: before or len(self.messages)]):
            words = set(str(m.get("content", "")).lower().replace(".", " ").split())
            score = len(words & set(terms))
            if score and m["role"] != "system":
                hits.append(SearchHit(i, i, f"h{i}", float(score)))
        hits.sort(key=lambda h: -h.score)
        return hits[:limit]


def conversation() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You chat."}]
    for t in range(30):
        out.append({"role": "user", "content": f"filler number {t} " + "blah " * 8})
        out.append({"role": "assistant", "content": f"reply number {t} " + "meh " * 8})
    out[5] = {"role": "user", "content": "My sister Ana moved to Porto last spring."}
    out[41] = {"role": "user", "content": "Porto is rainy but the pastries are great."}
    out.append({"role": "user", "content": "Where does my sister live now?"})
    return out


def recalled(expand: bool) -> tuple[list[tuple[int, int]], list[list[str]]]:
    messages = conversation()
    index = WordIndex(messages)
    service = RecallService(index, Metrics())
    decision = trim(messages, TrimSpec(max_tokens=60), simple_count, Budget(60))
    spec = RecallSpec(max_tokens=150, neighbors=0, expand=expand)
    _, outcome = asyncio.run(
        service.apply(
            policy="p",
            spec=spec,
            budget=150,
            ref=SessionRef("t", "s"),
            conversation=messages,
            hashes=[f"h{i}" for i in range(len(messages))],
            decision=decision,
            count=simple_count,
        )
    )
    return list(outcome.recalled.spans), index.searches


def test_the_second_hop_comes_back_only_with_expand():
    spans, searches = recalled(expand=False)
    assert (5, 6) in spans and (41, 42) not in spans and len(searches) == 1
    spans, searches = recalled(expand=True)
    assert (5, 6) in spans and (41, 42) in spans
    assert len(searches) == 2 and "porto" in searches[1] and "sister" not in searches[1]


def test_expansion_words_are_the_hits_content_words_shared_ones_first():
    texts = ["Ana moved to Porto in May.", "Porto again, and Lisbon."]
    words = expansion_terms(texts, ["sister"], exclude=frozenset({"ana"}))
    assert words[0] == "porto"
    assert "ana" not in words and "to" not in words and "in" not in words
    assert set(words) == {"porto", "moved", "may", "lisbon"}  # "again": a stopword
