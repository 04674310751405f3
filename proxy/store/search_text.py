"""The searchable text of a stored message or Responses item (what the recall index holds).

The same text as the migration that indexed existing items computes in SQL
(proxy/store/migrations.py, version 5): the message's content (a string, or
its text parts), each tool call's name and arguments, and a Responses item's
``arguments`` and ``output``. Media, reasoning and ids are left out: they are
not what a question about the conversation names.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

import snowballstemmer  # type: ignore[import-untyped]


def search_text(message: Mapping[str, Any]) -> str:
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        texts = [
            p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)
        ]
        parts.append("\n".join(texts))
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                name, arguments = function.get("name"), function.get("arguments")
                parts.append(
                    f"{name if isinstance(name, str) else ''} "
                    f"{arguments if isinstance(arguments, str) else ''}"
                )
    arguments = message.get("arguments")
    if isinstance(arguments, str):
        name = message.get("name")
        parts.append(f"{name if isinstance(name, str) else ''} {arguments}")
    output = message.get("output")
    if isinstance(output, str):
        parts.append(output)
    return "\n".join(parts).strip()


# The words of that text as SQLite's FTS5 ``porter unicode61`` sees them, for
# the indexes that tokenize in Python (Redis, the in-memory fake).
# unicode61: letters and digits are token characters; everything else separates.
_WORD = re.compile(r"[^\W_]+")
_PORTER = snowballstemmer.stemmer("porter")


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    # The stemmer is pure Python and slow (tens of microseconds a word); words repeat.
    return str(_PORTER.stemWord(word))


def tokens(text: str) -> list[str]:
    text = text.lower()
    if not text.isascii():
        decomposed = unicodedata.normalize("NFKD", text)
        text = "".join(c for c in decomposed if not unicodedata.combining(c))
    return _WORD.findall(text)


def words(text: str) -> list[str]:
    return [stem(w) for w in tokens(text)]
