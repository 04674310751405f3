"""A fake OpenAI Responses API upstream that records what it receives.

``POST /v1/responses`` answers in OpenAI's shapes (a response object, or its
typed SSE events), from a FIFO of scripted replies or, when the script is
empty, with an echo of the last user message. ``GET``/``DELETE
/v1/responses/{id}`` and ``GET .../input_items`` answer from what the fake
itself stored, so pass-through is observable.

It is as strict as OpenAI where replayed history can go wrong, so a proxy
that replays badly fails here as it would there:

- an unknown ``previous_response_id``: 400 ``previous_response_not_found``;
- a ``reasoning`` item without ``encrypted_content``: 404 "Item with id ...
  not found" (the fake is stateless, like ``store: false`` or another
  upstream);
- an output item it linked to a reasoning item, sent without that item right
  before it: 400 "... was provided without its required 'reasoning' item";
- a ``function_call`` without its ``function_call_output``, or an output
  without its call (unless the call is in the previous response): 400;
- a ``compaction`` or ``compaction_trigger`` item: 400, as an upstream that is
  not OpenAI's answers (unless ``compaction`` is set).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.upstream import Received


@dataclass
class Call:
    name: str
    arguments: str


@dataclass
class RReply:
    text: str | None = "ok"
    calls: list[Call] = field(default_factory=list)
    # Lead the output with a reasoning item (with encrypted content, or id only).
    reasoning: bool = False
    encrypted: bool = True
    status: str = "completed"
    # An HTTP error instead of an answer.
    http_status: int = 200
    # Stop a stream after this many events and drop the connection.
    break_after_events: int | None = None
    # End a stream cleanly, but without its terminal event (response.completed).
    no_terminal: bool = False
    chunk_delay: float = 0.0


def _error(status: int, message: str, param: str | None, code: str | None) -> web.Response:
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}
    }
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


@dataclass
class FakeResponses:
    replies: list[RReply] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    ids: Any = field(default_factory=lambda: itertools.count(1))
    # Every response the fake made, by id, and the input it was given.
    responses: dict[str, dict[str, Any]] = field(default_factory=dict)
    inputs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Output item id -> the reasoning item id it depends on.
    links: dict[str, str] = field(default_factory=dict)
    last_response: bytes = b""
    events_sent: int = 0
    # Whether it reads compaction items (as OpenAI's API does); else a 400, as any other.
    compaction: bool = False

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", self.create)
        app.router.add_post("/v1/responses/compact", self.compact)
        app.router.add_get("/v1/responses/{id}", self.retrieve)
        app.router.add_delete("/v1/responses/{id}", self.delete)
        app.router.add_get("/v1/responses/{id}/input_items", self.input_items)
        return app

    @property
    def last(self) -> dict[str, Any]:
        """The JSON body of the last POST /v1/responses."""
        posts = [r for r in self.received if r.method == "POST"]
        body = posts[-1].json
        assert isinstance(body, dict)
        return body

    async def _record(self, request: web.Request) -> Received:
        raw = await request.read()
        data = orjson.loads(raw) if raw else None
        rec = Received(request.method, request.path, dict(request.headers), raw, data)
        self.received.append(rec)
        return rec

    # -- POST ---------------------------------------------------------------

    async def compact(self, request: web.Request) -> web.Response:
        """OpenAI's /responses/compact, when the fake reads compaction (else a 404)."""
        body = (await self._record(request)).json
        if not self.compaction or not isinstance(body, dict):
            return _error(404, "Not found", None, None)
        users = [i for i in _items(body.get("input")) if i.get("role") == "user"]
        item = {"id": f"cmp_{next(self.ids)}", "type": "compaction", "encrypted_content": "gAAAA"}
        answer = {
            "id": f"resp_{next(self.ids)}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*users, item],
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def create(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json
        assert isinstance(body, dict)
        items = _items(body.get("input"))
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.responses:
            message = f"Previous response with id '{previous}' not found."
            return _error(400, message, "previous_response_id", "previous_response_not_found")
        refused = self._check(items, previous)
        if refused is not None:
            return refused
        reply = self.replies.pop(0) if self.replies else RReply(text=f"echo: {_last_user(items)}")
        if reply.http_status != 200:
            return _error(reply.http_status, "scripted failure", None, None)
        response = self._response(body, reply, items)
        if body.get("stream"):
            return await self._stream(request, response, reply)
        data = orjson.dumps(response)
        self.last_response = data
        return web.Response(
            body=data,
            content_type="application/json",
            headers={"x-request-id": f"req_{response['id']}"},
        )

    def _check(self, items: list[dict[str, Any]], previous: str | None) -> web.Response | None:
        calls = {i.get("call_id") for i in items if i.get("type") == "function_call"}
        outputs = {i.get("call_id") for i in items if i.get("type") == "function_call_output"}
        if previous is not None:
            calls |= {
                o.get("call_id")
                for o in self.responses[previous]["output"]
                if o.get("type") == "function_call"
            }
        for n, item in enumerate(items):
            kind = item.get("type", "message")
            if kind in ("compaction", "compaction_trigger") and not self.compaction:
                # As an upstream that is not OpenAI's: it knows neither item.
                message = f"Invalid value: '{kind}'. Supported values are: 'message', ..."
                return _error(400, message, f"input[{n}].type", "invalid_value")
            if kind == "reasoning" and not item.get("encrypted_content"):
                message = f"Item with id '{item.get('id')}' not found. Items are not persisted when `store` is set to false."
                return _error(404, message, "input", None)
            needed = self.links.get(str(item.get("id")))
            if needed is not None and (n == 0 or items[n - 1].get("id") != needed):
                message = f"Item '{item['id']}' of type '{kind}' was provided without its required 'reasoning' item: '{needed}'."
                return _error(400, message, "input", None)
            if kind == "function_call" and item.get("call_id") not in outputs:
                return _error(
                    400,
                    f"No tool output found for function call {item.get('call_id')}.",
                    "input",
                    None,
                )
            if kind == "function_call_output" and item.get("call_id") not in calls:
                message = f"No tool call found for function call output with call_id {item.get('call_id')}."
                return _error(400, message, "input", None)
        return None

    def _response(
        self, body: dict[str, Any], reply: RReply, items: list[dict[str, Any]]
    ) -> dict[str, Any]:
        n = next(self.ids)
        output: list[dict[str, Any]] = []
        reasoning_id = None
        if reply.reasoning:
            reasoning_id = f"rs_{n}"
            reasoning: dict[str, Any] = {"type": "reasoning", "id": reasoning_id, "summary": []}
            if reply.encrypted:
                reasoning["encrypted_content"] = f"enc-{n}"
            output.append(reasoning)
        for k, call in enumerate(reply.calls):
            output.append(
                {
                    "type": "function_call",
                    "id": f"fc_{n}_{k}",
                    "call_id": f"call_{n}_{k}",
                    "name": call.name,
                    "arguments": call.arguments,
                    "status": "completed",
                }
            )
        if reply.text is not None:
            output.append(
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "status": "completed",
                    "role": "assistant",
                    "content": [
                        {
                            "type": "output_text",
                            "text": reply.text,
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                }
            )
        if reasoning_id is not None and len(output) > 1:
            # As OpenAI does: the item after reasoning needs it replayed with it.
            self.links[output[1]["id"]] = reasoning_id
        text = "".join(p["text"] for o in output if o["type"] == "message" for p in o["content"])
        response = {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": int(time.time()),
            "status": reply.status,
            "completed_at": int(time.time()) if reply.status == "completed" else None,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"}
            if reply.status == "incomplete"
            else None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body.get("model", "gpt-4o"),
            "output": output,
            "output_text": text,
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": None,
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_p": body.get("top_p", 1.0),
            "truncation": "disabled",
            "usage": {
                "input_tokens": 10 * len(items),
                "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 10 * len(items) + 5,
            },
            "metadata": body.get("metadata") or {},
        }
        if body.get("store", True) is not False:
            self.responses[response["id"]] = response
            self.inputs[response["id"]] = items
        return response

    async def _stream(
        self, request: web.Request, response: dict[str, Any], reply: RReply
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        sent: list[bytes] = []
        for number, event in enumerate(_events(response)):
            if reply.break_after_events is not None and number >= reply.break_after_events:
                self.last_response = b"".join(sent)
                assert request.transport is not None
                request.transport.close()
                return resp
            if reply.no_terminal and event["type"] == "response.completed":
                break
            if reply.chunk_delay:
                await asyncio.sleep(reply.chunk_delay)
            data = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
            try:
                await resp.write(data)
            except (ConnectionResetError, RuntimeError):
                break
            sent.append(data)
            self.events_sent += 1
        self.last_response = b"".join(sent)
        await resp.write_eof()
        return resp

    # -- GET / DELETE ---------------------------------------------------------

    async def retrieve(self, request: web.Request) -> web.Response:
        await self._record(request)
        found = self.responses.get(request.match_info["id"])
        if found is None:
            return _error(404, "No response found.", None, None)
        return web.Response(body=orjson.dumps(found), content_type="application/json")

    async def delete(self, request: web.Request) -> web.Response:
        await self._record(request)
        rid = request.match_info["id"]
        if self.responses.pop(rid, None) is None:
            return _error(404, "No response found.", None, None)
        return web.Response(
            body=orjson.dumps({"id": rid, "object": "response", "deleted": True}),
            content_type="application/json",
        )

    async def input_items(self, request: web.Request) -> web.Response:
        await self._record(request)
        rid = request.match_info["id"]
        if rid not in self.inputs:
            return _error(404, "No response found.", None, None)
        data = [
            {"id": f"in_{rid}_{k}", "type": "message", **i} for k, i in enumerate(self.inputs[rid])
        ]
        body = {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": False,
        }
        return web.Response(body=orjson.dumps(body), content_type="application/json")


def _items(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value or [])


def _last_user(items: list[dict[str, Any]]) -> str:
    for item in reversed(items):
        if item.get("role") == "user" and item.get("type", "message") == "message":
            content = item.get("content")
            if isinstance(content, str):
                return content
            return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))
    return ""


def _events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The typed events OpenAI streams for ``response``, with sequence numbers."""
    opening = {k: v for k, v in response.items() if k != "usage"}
    opening.update(status="in_progress", output=[], output_text="", completed_at=None)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    for index, item in enumerate(response["output"]):
        if item["type"] == "message":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                }
            )
            part = item["content"][0]
            empty = {**part, "text": ""}
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append({"type": "response.content_part.added", **common, "part": empty})
            text = part["text"]
            for i in range(0, len(text), 4):
                events.append(
                    {
                        "type": "response.output_text.delta",
                        **common,
                        "delta": text[i : i + 4],
                        "logprobs": [],
                    }
                )
            events.append(
                {"type": "response.output_text.done", **common, "text": text, "logprobs": []}
            )
            events.append({"type": "response.content_part.done", **common, "part": part})
        elif item["type"] == "function_call":
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                }
            )
            common = {"item_id": item["id"], "output_index": index}
            args = item["arguments"]
            for i in range(0, len(args), 5):
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        **common,
                        "delta": args[i : i + 5],
                    }
                )
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **common,
                    "name": item["name"],
                    "arguments": args,
                }
            )
        else:
            events.append(
                {"type": "response.output_item.added", "output_index": index, "item": item}
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    terminal = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": terminal, "response": response})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]
