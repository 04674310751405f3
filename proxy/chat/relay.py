"""Relaying the upstream's answer to the client: whole, or event by event as it streams.

The client gets the upstream's own bytes; the reply is read from a copy of
them (proxy/chat/stream.py) and recorded (proxy/chat/finish.py).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import Response, StreamingResponse

from proxy.chat.finish import ExchangeFinish
from proxy.chat.stream import ChatReplyAssembler, ReplyAssembler, reply_from_completion
from proxy.context.tokens import LONG_TEXT, counter_for
from proxy.errors import ProxyError, UpstreamError, upstream_failure
from proxy.http.body import error_response, relay_headers
from proxy.http.shape import valid_reply
from proxy.upstream.base import UpstreamResponse


class ExchangeRelay(ExchangeFinish):
    """The answer, relayed; the exchange finished once it is sent (or as it ends)."""

    async def _relay(self, response: UpstreamResponse) -> Response:
        """Relay the answer: event by event when it streams, else whole (both APIs)."""
        is_sse = any(
            k.lower() == "content-type" and v.startswith("text/event-stream")
            for k, v in response.headers
        )
        if self.stream and response.status == 200 and is_sse:
            return self._relay_stream(response)
        return await self._relay_whole(response)

    async def _relay_whole(self, response: UpstreamResponse) -> Response:
        try:
            content = await response.read()
        except ProxyError as error:
            self._finish_failed(error.status, error, upstream_status=response.status)
            return error_response(error, self._headers(), self.door)
        # The headers first: nothing is recorded for an answer that could not be sent.
        out = Response(content, status_code=response.status)
        out.raw_headers = relay_headers(response.headers, self._headers())
        out.raw_headers.append((b"content-length", str(len(content)).encode()))
        durable = self._durable()
        if not durable and len(content) < LONG_TEXT:
            # The reply is read off the body once the answer is on its way, with the row,
            # the log line and the metrics (see ``sent``): the client does not wait for it.
            self.after = functools.partial(self._finish_whole, response.status, content)
            return out
        reply = self._whole_reply(response.status, content)
        if reply[0] is not None and len(content) >= LONG_TEXT:
            await counter_for(self.model or "").precount([reply[0]])
        finish = functools.partial(self._finish_whole, response.status, content, reply)
        if durable:
            # The next request replays this one: committed before the client has it.
            await self._committed(finish())
        else:
            self.after = finish
        return out

    def _whole_reply(
        self, status: int, content: bytes
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None, UpstreamError | None]:
        """A whole answer's reply, usage, and why a 200 is not an answer (if it is not)."""
        if status != 200:
            # Relayed as it came; a 5xx's error is named in the row and the log line.
            return None, None, upstream_failure(status, content)
        completion = reply_from_completion(content)
        reply, usage = completion.message, completion.usage
        self.answered_as = completion.model
        if reply is None or not valid_reply(reply):
            # Relayed as it came, but not an answer: the user message is not
            # stored as if it had been answered; the row says why.
            invalid = UpstreamError(
                "The upstream's 200 answer is not a chat completion.",
                code="upstream_invalid_response",
            )
            return None, usage, invalid
        if "role" not in reply:
            reply["role"] = "assistant"
        return reply, usage, None

    def _finish_whole(
        self,
        status: int,
        content: bytes,
        reply: tuple[dict[str, Any] | None, dict[str, Any] | None, UpstreamError | None]
        | None = None,
    ) -> asyncio.Future[Any] | None:
        message, usage, invalid = reply if reply is not None else self._whole_reply(status, content)
        return self._finish(
            status,
            message,
            usage=usage,
            upstream_status=status,
            error=invalid,
            failed=invalid is not None,
        )

    def _assembler(self) -> ReplyAssembler:
        """What reads the relayed stream's reply (a door reads its own events)."""
        return ChatReplyAssembler()

    def _stream_error(self, error: ProxyError) -> bytes:
        """An error told in-stream, the headers being gone already (as OpenAI does)."""
        return b"data: " + error.body_bytes() + b"\n\n"

    def _relay_stream(self, response: UpstreamResponse) -> Response:
        assembler = self._assembler()

        durable = self._durable()

        async def relay() -> AsyncIterator[bytes]:
            error: ProxyError | None = None
            finished = counted = False
            self.rt.metrics.active_streams.inc()
            try:
                async for chunk in response.iter_chunks():
                    assembler.feed(chunk)
                    if assembler.done and assembler.malformed:
                        # The client is told before the end marker, and never gets it
                        # (its SDK stops reading there): the turn is not stored, so
                        # the client and the stored history agree that it failed.
                        yield assembler.before_end(chunk)
                        break
                    if assembler.whole and not counted:
                        counted = True
                        if assembler.size >= LONG_TEXT:
                            await counter_for(self.model or "").precount([assembler.message()])
                        if durable:
                            # The chunk holding [DONE] waits for the commit: a reply
                            # the client saw complete is a reply stored.
                            finished = True
                            await self._committed(self._finish_stream(assembler, None, None))
                    yield chunk
                error = assembler.unfinished()
                if error is not None:
                    event = self._unfinished_event(error)
                    if not assembler.errored:  # else the client has the upstream's own
                        yield event
            except UpstreamError as exc:
                error = exc
                yield self._unfinished_event(exc)
            finally:
                self.rt.metrics.active_streams.dec()
                if finished:
                    self.rt.background.spawn(response.close(), name=f"close-{self.id}")
                else:
                    self._finish_stream(assembler, error, response)

        out = StreamingResponse(relay(), status_code=200)
        out.raw_headers = relay_headers(response.headers, self._headers())
        return out

    def _unfinished_event(self, error: ProxyError) -> bytes:
        """The in-stream event telling the client its stream did not end whole, counted."""
        route = self.route.name if self.route is not None else "none"
        self.rt.metrics.unfinished_streams.inc((route, error.code or error.type))
        return self._stream_error(error)

    def _finish_stream(
        self,
        assembler: ReplyAssembler,
        error: ProxyError | None,
        upstream: UpstreamResponse | None,
    ) -> asyncio.Future[Any] | None:
        """Record a relayed stream: whole, cut short (stored, marked), or malformed (not:
        the client was sent an error instead of the end marker)."""
        self.answered_as = assembler.model
        malformed = assembler.malformed > 0
        if malformed and error is None:
            error = assembler.unfinished()
        return self._finish(
            200,
            assembler.message() if assembler.chunks else None,
            usage=assembler.usage,
            upstream_status=200,
            incomplete=not assembler.whole,
            error=error,
            failed=malformed,
            upstream=upstream,
        )
