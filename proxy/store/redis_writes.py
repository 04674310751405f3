"""One RECORD script call of the Redis store: its arguments, and what its reply means.

An exchange (or a response) is prepared once, when it is handed to the store:
the chain cache gives the resent prefix, and only the items after it are
encoded. The reply either settles it (an ``ExchangeResult``, or the error the
caller sees) or asks for the call again with more (``RETRY``): the cached
session was gone (``stale``: resend everything) or new items were sent without
their recall words (``words``: resend with the words of those). Keeping this
apart from the store lets the store send many calls in one pipeline
(proxy/store/redis.py) and retry only those that need it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from proxy.store import redis_codec as codec
from proxy.store.base import (
    ExchangeResult,
    FencedOut,
    MessageIn,
    RequestRecord,
    SessionRef,
    Storable,
)
from proxy.store.chains import ChainCache

RETRY: Final = object()

# RECORD's arguments 9-22 for a write without items.
_NO_CHAIN = ("", "", 0, 0, "n", "n", "n", "", "n", "", "", "n", "", 0)


class RecordCall:
    def __init__(
        self,
        chains: ChainCache,
        ttl_ms: str,
        index: codec.Words | None,
        now: float,
        session: SessionRef | None,
        conversation: Sequence[Storable],
        output: Sequence[MessageIn],
        request: RequestRecord,
        response: tuple[str, bytes] | None = None,
    ) -> None:
        """``output``: the reply (or a response's output items); ``response``: its id and row."""
        self.chains, self.ttl_ms, self.now, self.request = chains, ttl_ms, now, request
        self.index = index
        self.session, self.conv = session, len(conversation)
        self.chain = [*conversation, *output]
        created_at = request.created_at or now
        tenant = session.tenant if session else request.tenant
        key = session.key if session else request.session_key
        if response is not None:
            assert session is not None
            self.mode, self.response = "response", response
        elif session is not None and self.chain:
            self.mode, self.response = "chain", ("", b"")
        else:
            # No items: only the row, filed under the name it gave (if any) without a session.
            self.mode = "fail" if session else "named" if key is not None else "row"
        self.head = codec.row_head(request, tenant, key, created_at)
        self._args: list[str | bytes | int] | None = None
        self.fixed: list[str | bytes | int] = [
            self.mode, tenant, key or "", repr(now), ttl_ms, request.id, self.head,
        ]  # fmt: skip
        if self.mode not in ("chain", "response"):
            return
        assert session is not None
        self.content = [m.content_hash for m in self.chain]
        self.prefix = chains.prefix(session, self.content)
        cached = self.prefix.session_id is not None
        self.known: Sequence[int] = self.prefix.known_ids if cached else ()
        self.wanted: set[int] | None = None
        token = request.detail.get("fence")
        self.fence = str(token) if isinstance(token, int) and not isinstance(token, bool) else ""

    def args(self) -> list[str | bytes | int]:
        """The script's arguments (encoded once; again only after a ``RETRY``)."""
        if self._args is None:
            self._args = self._encode()
        return self._args

    def _encode(self) -> list[str | bytes | int]:
        if self.mode not in ("chain", "response"):
            return [*self.fixed, *_NO_CHAIN]
        chain, conv = self.chain, self.conv
        spec = codec.Specs(self.known)
        last = len(chain) - 1
        # Rows hold dropped positions as spans (in the row's JSON), no item ids.
        dropped = ""
        return [
            *self.fixed, str(self.prefix.session_id or ""), spec.parent, len(self.known), conv,
            spec(0) if conv else "n", spec(conv - 1) if conv else "n",
            spec(last) if len(chain) > conv else "n", dropped,
            spec(last) if chain else "n", self.response[0], self.response[1],
            spec(conv - 1) if conv else "n", self.fence,
            *codec.quadruples(chain, self.prefix.path_hashes, len(self.known), self.now,
                              self.wanted, self.index),
        ]  # fmt: skip

    def settle(self, out: list[Any]) -> Any:
        """The ``ExchangeResult`` (None without a session) or ``RETRY``; raises the call's error."""
        status = out[0]
        if status in (b"stale", b"words"):
            self._args = None
        if status == b"stale":  # the cached session is gone: send everything
            assert self.session is not None
            self.chains.forget(self.session)
            self.known, self.wanted = (), None
            return RETRY
        if status == b"words":
            self.wanted = {int(n) for n in out[1:]}
            return RETRY
        if status == b"fenced":
            raise FencedOut(
                f"session lock lost: fencing token {self.fence} is older than the session's;"
                " the exchange is not stored"
            )
        codec.check(out, self.request)
        if self.mode not in ("chain", "response"):
            if self.session is None or not out[1]:
                return None
            return ExchangeResult(int(out[1]), [], None, 0)
        assert self.session is not None
        session_id = int(out[1])
        ids = [*self.known, *(int(i) for i in out[3:])]
        if ids:
            self.chains.committed(
                self.session, session_id, self.content, self.prefix.path_hashes, ids
            )
        reply_id = ids[-1] if len(self.chain) > self.conv else None
        outputs = tuple(ids[self.conv :]) if self.mode == "response" else ()
        return ExchangeResult(session_id, ids[: self.conv], reply_id, int(out[2]), outputs)
