"""POST /v1/chat/completions: the pipeline from the client's bytes to the stored exchange.

parse -> route -> session -> policy -> upstream -> relay (+ assemble) -> store.
The state the steps fill in is :mod:`proxy.chat.state`; the relay
:mod:`proxy.chat.relay`; the ending (row, line, metrics, store write)
:mod:`proxy.chat.finish` and :mod:`proxy.chat.record`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from policies.types import Decision, SummarizeSpec
from proxy.chat.cache_step import cache_hints, measure_stable_prefix
from proxy.chat.policy_step import choose_mode, mode_rule, summarize
from proxy.chat.recall_step import recall_step, spec_recall
from proxy.chat.relay import ExchangeRelay
from proxy.context.message_cache import item_counter, message_in
from proxy.context.rewriter import needs_window
from proxy.context.tokens import LONG_TEXT, counter_for
from proxy.errors import InvalidRequest, ProxyError
from proxy.http.asgi import respond
from proxy.http.body import error_response, forward_headers, parse_object, read_body
from proxy.http.session_lookup import find_session, session_hint
from proxy.http.sessions import session_ref
from proxy.http.shape import (
    MAX_DEPTH,
    check_chat,
    check_chat_envelope,
    check_chat_message,
    check_depth,
)
from proxy.runtime import Runtime
from proxy.store.base import SessionRef, StoredItem
from proxy.upstream.base import UpstreamRequest
from proxy.upstream.cache_hints import splice_field


def validate_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The body's shape (proxy/http/shape.py); its messages."""
    return check_chat(body)


class ChatExchange(ExchangeRelay):
    """One request's journey through the pipeline (the endpoint's steps).

    Another door (proxy/messages/) runs the same steps over the chat messages it
    read its dialect into: :meth:`plan` takes them, ``_send`` is the door's own.
    """

    # Whether the body's messages are the request bytes' own (False: a door's
    # translation, so the message cache keeps no byte prefix of them).
    wire_messages = True

    # -- the pipeline ---------------------------------------------------------

    async def run(self) -> Response:
        try:
            return await self._run()
        except ProxyError as error:
            self._finish_failed(error.status, error)
            return error_response(error, self._headers(), self.door)
        except BaseException:
            # Unexpected: the app's last-resort handler answers; never leave a session locked.
            self._unlock()
            self.rt.release()
            raise

    def sent(self) -> None:
        """The answer was sent (or its sending ended): record the exchange, if that waited."""
        after, self.after = self.after, None
        if after is not None:
            after()

    async def _run(self) -> Response:
        self.raw = await read_body(
            self.request, self.rt.config.server.max_body_bytes, self.rt.config.server.body_timeout_s
        )
        body = self._resent_body()
        if body is None:
            body = parse_object(self.raw, deferred="messages")
        await self.plan(body)
        return await self._send(body)

    def _resent_body(self) -> dict[str, Any] | None:
        """The body, when it is its session's last one continued: only the new part parsed
        (proxy/http/resent_body.py). The session is the one the headers (or the bytes'
        prompt_cache_key) name, a hint (proxy/http/session_lookup.py); plan() finds it
        from the parsed body as for any other request."""
        key = session_hint(self.rt.config.session, self.headers, self.raw)
        if not key or not self.may_store:
            return None
        body = self.rt.messages.resent_body(SessionRef(self.tenant, key), self.raw)
        if body is not None:
            # The fields after the messages are new: their depth is checked as a full
            # parse checks them (the messages as parse_object leaves them, one by one).
            check_depth(body, MAX_DEPTH + 1, deferred="messages")
        return body

    async def plan(self, body: dict[str, Any], *, lock: bool = True) -> Decision:
        """Everything before the upstream: route, session, stored history, the decision.

        The preview endpoint runs exactly this, with ``lock=False`` (read-only).
        """
        rt = self.rt
        messages = check_chat_envelope(body)
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidRequest("'model' is required and must be a string.", param="model")
        self.model = model
        self.stream = body.get("stream") is True
        self.route = rt.router.match(self.endpoint, model, self.headers)
        found = find_session(rt.config.session, self.headers, body)
        self.key, self.session_source = found.key, found.source
        self.ref = session_ref(self.tenant, self.key) if self.may_store else None
        # A door's own additions to the conversation, now that the session is known.
        messages = await self._door_messages(messages)
        server_history = self.route.history == "server" and self.ref is not None
        # What the session's message cache knows of a client-held history: a
        # message it holds is the JSON of one checked, hashed and counted before.
        lookup = (
            rt.messages.lookup(self.ref, messages)
            if self.ref is not None and not server_history
            else None
        )
        unknown = lookup.unknown if lookup is not None else range(len(messages))
        for i in unknown:
            check_chat_message(messages[i], i)

        self.conversation = messages
        left_out: list[int] = []
        stored: list[StoredItem] = []
        if server_history and self.ref is not None:
            if lock:
                # Serialise the session: the next request must see this one's reply.
                self.fence = await rt.locks.acquire(self.ref)
                self.locked = True
            started = time.perf_counter()
            # Shared: the cached chain's own objects, only read here.
            stored = await rt.store.history(self.ref, shared=True)
            rt.metrics.store_seconds.observe(("history",), time.perf_counter() - started)
            self.conversation = [item.message for item in stored] + messages

        counter = counter_for(model)
        if len(self.raw) >= LONG_TEXT or self.conversation is not messages:
            # Long texts are counted in a worker thread first: no stall for the others.
            # Messages the cache holds are counted already.
            todo = self.conversation if lookup is None else [messages[i] for i in lookup.unknown]
            if stored:
                todo = messages
            await counter.precount(todo)
        counts: list[int]
        if self.ref is not None and server_history:
            # The stored chain as it is (checked and counted only where new since
            # the session's last turn), then the new messages, hashed and counted.
            how = (counter.encoding_name, counter.scale)
            view = rt.history_views.view(self.ref, stored, how, item_counter(counter))
            left_out = view.left_out
            fresh = [message_in(m, counter) for m in messages]
            self.stored = [*stored, *fresh]
            self.hashes = [m.content_hash for m in self.stored]
            counts = view.counts
            counts += (m.token_count or 0 for m in fresh)
        elif self.ref is not None:
            # Each message's identity in the store (and the token cache's key) and
            # its token count; what the session sent before is not done again.
            self.stored = rt.messages.messages(
                self.ref,
                self.conversation,
                counter,
                lookup=lookup,
                body=(self.raw, body) if self.wire_messages else None,
            )
            self.hashes = [m.content_hash for m in self.stored]
            counts = [m.token_count or 0 for m in self.stored]
        else:
            # Nothing to store: only the counts (each message hashed for the count cache).
            counts = counter.count_all(self.conversation)
        if left_out:
            assert self.hashes is not None
            # Stored whole (self.stored), forwarded without the replies that were not one.
            skip = set(left_out)
            keep = [i for i in range(len(self.conversation)) if i not in skip]
            self.conversation = [self.conversation[i] for i in keep]
            self.hashes = [self.hashes[i] for i in keep]
            counts = [counts[i] for i in keep]
        choice = choose_mode(self.route, self.conversation, self.headers)
        self.policy, self.mode = choice.policy, choice.mode
        self.mode_rule = mode_rule(self.route, choice)
        spec = rt.rewriter.spec(self.policy)
        if needs_window(spec):
            await rt.windows.learn(self.route.upstream, model)  # once: a local server's n_ctx
        started = time.perf_counter()
        if isinstance(spec, SummarizeSpec):
            self.decision, self.summary, self.summary_ctx = await summarize(
                rt,
                spec,
                route=self.route,
                ref=self.ref,
                conversation=self.conversation,
                hashes=self.hashes,
                body=body,
                model=model,
                headers=self.headers,
                dry_run=not lock,
                counts=counts,
            )
        else:
            self.decision = rt.rewriter.decide(
                self.policy,
                self.conversation,
                body,
                model,
                self.hashes,
                counts=counts,
                memo=rt.summaries.memo,
                ref=self.ref,
                upstream=self.route.upstream,
            )
        # A door's own context features over the policy's decision (Anthropic's edits).
        self.decision = self._door_decision(self.decision)
        waited = (self.summary.wait_ms or 0.0) / 1000 if self.summary else 0.0
        self.policy_s = time.perf_counter() - started - waited
        # Measured on the policy's list: a recall block goes after the stable prefix.
        self.stable_prefix = measure_stable_prefix(
            rt.prefixes, self.ref, self.decision, self.conversation, self.hashes, remember=lock
        )
        if spec_recall(spec) is not None:
            self.decision, self.recall = await recall_step(
                rt,
                self.policy,
                spec,
                self.ref,
                self.conversation,
                self.hashes,
                self.decision,
                model,
                sizes=counts,
            )
        return self.decision

    async def _door_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the door's own features make it (chat has none): route,
        model and session are known here (Anthropic's compaction: proxy/messages/compaction.py)."""
        return messages

    def _door_decision(self, decision: Decision) -> Decision:
        """The decision as the door's own features leave it (chat has none)."""
        return decision

    async def _send(self, body: dict[str, Any]) -> Response:
        rt = self.rt
        assert self.route is not None and self.decision is not None  # plan() ran
        upstream_config = rt.config.upstreams[self.route.upstream]
        self.cache = cache_hints(
            upstream_config, self.ref, body, self.decision.messages, slots=True
        )
        forwarded = self._forward_body(body)
        upstream = rt.upstreams[self.route.upstream]
        sent = time.perf_counter()
        response = await upstream.send(
            UpstreamRequest(
                method="POST",
                path="/chat/completions",
                headers=forward_headers(
                    self.header_items, upstream_config, rt.config.session.header
                ),
                body=forwarded,
                json=None
                if upstream_config.base_url
                else {**body, "messages": self.cache.messages or self.decision.messages},
                stream=self.stream,
            )
        )
        self.upstream_ms = (time.perf_counter() - sent) * 1000
        return await self._relay(response)

    def _forward_body(self, body: dict[str, Any]) -> bytes:
        assert self.decision is not None
        key = self.cache.prompt_cache_key if self.cache is not None else None
        slot = self.cache.id_slot if self.cache is not None else None
        if not self.decision.changed and self.conversation is body["messages"]:
            # The client's bytes are sacred: nothing changed, so forward them as they
            # came (with the session's cache hints, the documented additions).
            raw = self.raw if key is None else splice_field(self.raw, "prompt_cache_key", key)
            return raw if slot is None else splice_field(raw, "id_slot", slot)
        out = {**body, "messages": self.decision.messages}
        if key is not None:
            out["prompt_cache_key"] = key
        if slot is not None:
            out["id_slot"] = slot
        return orjson.dumps(out)


class ExchangeEndpoint:
    """An endpoint of the pipeline, a raw ASGI app (Starlette mounts it as a route): each
    request is an exchange of ``kind`` (a door's), its answer sent without Starlette's
    Response machinery (proxy/http/asgi.py), then recorded."""

    def __init__(self, kind: Callable[[Runtime, Request], ChatExchange]) -> None:
        self.kind = kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rt: Runtime = scope["app"].state.runtime
        # Pinned: a config reload mid-request must not change this request's route or policy.
        exchange = self.kind(rt.pin(), Request(scope, receive, send))
        response = await exchange.run()
        try:
            await respond(response, receive, send)
        finally:
            exchange.sent()


chat_completions = ExchangeEndpoint(ChatExchange)
