"""The proxy's compaction item: versioned, self-contained, checked; and its expansion.

An item the proxy answers a compaction with is the Responses API's
``{"type": "compaction", "id": "cmp_...", "encrypted_content": ...}``. Its
``encrypted_content`` is not encrypted (the client holds the conversation it
summarizes anyway) but it is the proxy's own, and says so::

    ctxproxy.compaction.v1:<base64url(zlib(JSON payload))>.<checksum>

The payload carries the summary text and its pinned facts, how many items it
covers and the path hash of the last of them: all an instance needs to
expand it, with no store, on any instance, after the session expired. The
checksum (keyed BLAKE2b) catches a truncated or edited payload, which is
answered as a 400 instead of a garbled summary.

Expansion, on every request: the proxy's item becomes one user message stating
it is the summary of the earlier conversation (every model reads that), and
the items before it that it covers (a client that kept them) are folded away
but for system and developer messages. An item the proxy did not make (one of
OpenAI's) is left untouched where the upstream may read it, and taken out
where the proxy answers compaction itself; so is a ``compaction_trigger`` that
is not the last input item (it asks nothing there).
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.facts import facts_from_json
from policies.items import kind_of
from policies.transcript import summary_content
from policies.types import Message, SummaryState
from proxy.errors import InvalidRequest
from proxy.store.base import chain_path_hashes

VERSION = 1
PREFIX = f"ctxproxy.compaction.v{VERSION}:"
# Not a secret: a checksum that only this format's writer computes this way.
_CHECK_KEY = b"ctxproxy-compaction"
TRIGGER = "compaction_trigger"
# The most a payload may inflate to (a summary is a few KB).
MAX_PAYLOAD = 4 * 1024 * 1024


@dataclass(frozen=True)
class CompactionPayload:
    """What a compaction item carries."""

    summary: str
    facts: tuple[dict[str, str], ...] = ()
    # How many items of the conversation it stands for, and the path hash of the last.
    items: int = 0
    covers: str | None = None
    summary_id: int | None = None
    model: str | None = None
    created_at: int = 0

    def message(self) -> dict[str, Any]:
        """The summary as a message every model reads."""
        text = summary_content(self.summary, facts_from_json(list(self.facts)))
        return {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }

    def state(self, covers: int) -> SummaryState:
        """The summary as a plan takes it: it covers the first ``covers`` items."""
        return SummaryState(covers, 0, self.summary, facts_from_json(list(self.facts)), None)


def _check(body: bytes) -> str:
    return hashlib.blake2b(body, digest_size=12, key=_CHECK_KEY).hexdigest()


def encode(payload: CompactionPayload) -> str:
    data = orjson.dumps(
        {
            "v": VERSION,
            "summary": payload.summary,
            "facts": list(payload.facts),
            "items": payload.items,
            "covers": payload.covers,
            "summary_id": payload.summary_id,
            "model": payload.model,
            "created_at": payload.created_at,
        }
    )
    body = base64.urlsafe_b64encode(zlib.compress(data, 6)).rstrip(b"=")
    return f"{PREFIX}{body.decode()}.{_check(body)}"


def make_item(payload: CompactionPayload) -> dict[str, Any]:
    return {
        "id": f"cmp_{os.urandom(16).hex()}",
        "type": "compaction",
        "encrypted_content": encode(payload),
    }


def is_own(item: Mapping[str, Any]) -> bool:
    content = item.get("encrypted_content")
    return isinstance(content, str) and content.startswith(PREFIX)


def decode(content: str, where: str = "input") -> CompactionPayload:
    """The payload of the proxy's own item; a 400 naming ``where`` when it is damaged."""
    body, _, check = content[len(PREFIX) :].rpartition(".")
    damaged = InvalidRequest(
        f"{where} is a ctxproxy compaction item whose content is damaged.",
        param=where,
        code="invalid_compaction_item",
    )
    if not body or _check(body.encode()) != check:
        raise damaged
    try:
        packed = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        # Bounded: a crafted payload (its checksum is no secret) inflates no further.
        inflate = zlib.decompressobj()
        raw = inflate.decompress(packed, MAX_PAYLOAD)
        if inflate.unconsumed_tail or not inflate.eof:
            raise damaged
        data = orjson.loads(raw)
    except (ValueError, zlib.error) as exc:
        raise damaged from exc
    if not isinstance(data, dict) or data.get("v") != VERSION:
        raise damaged
    summary, facts = data.get("summary"), data.get("facts") or []
    items, created = data.get("items", 0), data.get("created_at", 0)
    if not isinstance(summary, str) or not isinstance(facts, list):
        raise damaged
    if not _count(items) or not _count(created):
        raise damaged
    return CompactionPayload(
        summary=summary,
        facts=tuple(f for f in facts if isinstance(f, dict) and _strings(f)),
        items=items,
        covers=_text(data.get("covers")),
        summary_id=data.get("summary_id") if _count(data.get("summary_id")) else None,
        model=_text(data.get("model")),
        created_at=created,
    )


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _strings(fact: Mapping[str, Any]) -> bool:
    return all(isinstance(k, str) and isinstance(v, str) for k, v in fact.items())


@dataclass(frozen=True)
class Expanded:
    """The input as it is forwarded and stored, and what expansion did to it."""

    items: list[dict[str, Any]]
    # The proxy's items expanded, items they covered folded away, foreign ones taken out.
    expanded: int = 0
    folded: int = 0
    foreign_dropped: int = 0
    stray_triggers: int = 0
    # The newest expanded summary as a plan's state over ``items`` (incremental summaries).
    previous: SummaryState | None = None
    payloads: list[CompactionPayload] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.expanded or self.foreign_dropped or self.stray_triggers)

    def detail(self) -> dict[str, int]:
        shown = {
            "expanded": self.expanded,
            "folded": self.folded,
            "foreign_dropped": self.foreign_dropped,
            "stray_triggers": self.stray_triggers,
        }
        return {k: v for k, v in shown.items() if v}


def expand(
    items: Sequence[dict[str, Any]],
    hash_of: Callable[[Message], str],
    *,
    keep_foreign: bool,
) -> Expanded:
    """``items`` with the proxy's compaction items expanded (see the module docstring).

    ``hash_of``: an item's content hash (the store's), for the covered path.
    ``keep_foreign``: leave other compaction items and triggers in (the upstream reads them).
    """
    kinds = [kind_of(item) for item in items]
    if "compaction" not in kinds and TRIGGER not in kinds:
        return Expanded(list(items))
    out: list[dict[str, Any]] = []
    hashes: list[str] = []
    expanded = folded = foreign = stray = 0
    previous: SummaryState | None = None
    payloads: list[CompactionPayload] = []
    for i, (item, kind) in enumerate(zip(items, kinds, strict=True)):
        if kind == TRIGGER and not keep_foreign:
            stray += 1
            continue
        if kind == "compaction" and is_own(item):
            payload = decode(str(item["encrypted_content"]), f"input[{i}]")
            message = payload.message()
            at = covered_at(hashes, payload)
            if at is None:
                out.append(message)
                hashes.append(hash_of(message))
                previous = payload.state(len(out))
            else:
                # The client kept what the item stands for (first ``at`` items): folded into
                # the summary, in their place, as it was forwarded when it was made.
                kept = [j for j in range(at) if _pinned(out[j])]
                folded += at - len(kept)
                out = [*(out[j] for j in kept), message, *out[at:]]
                hashes = [*(hashes[j] for j in kept), hash_of(message), *hashes[at:]]
                previous = payload.state(len(kept) + 1)
            payloads.append(payload)
            expanded += 1
            continue
        if kind == "compaction" and not keep_foreign:
            foreign += 1
            continue
        out.append(item)
        hashes.append(hash_of(item))
    return Expanded(out, expanded, folded, foreign, stray, previous, payloads)


def covered_at(hashes: Sequence[str], payload: CompactionPayload) -> int | None:
    """How many of the items (by content hash, root first) the payload covers, when they
    are the items it was made of (None: they are not)."""
    if payload.covers is None or not hashes:
        return None
    paths = chain_path_hashes(hashes)
    n = payload.items
    if 0 < n <= len(paths) and paths[n - 1] == payload.covers:
        return n
    return None


def _pinned(item: Mapping[str, Any]) -> bool:
    return kind_of(item) == "message" and item.get("role") in ("system", "developer")
