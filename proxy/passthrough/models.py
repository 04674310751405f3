"""``GET /v1/models``: every upstream's list, merged; ``/v1/models/{id}`` too.

The merged list has Anthropic's shape for an Anthropic client, OpenAI's
otherwise, whichever API each upstream speaks (proxy/passthrough/model_shapes.py).

The lists are fetched concurrently, each with the client's headers as that
upstream's config forwards them, and merged in config order: the first
upstream listing an id wins, later duplicates are left out. An upstream
that fails (unreachable, a timeout, an error status, a body that is not a
list) is skipped, logged with its name and host, and named in the
``X-Ctxproxy-Models-Skipped`` header; the answer is a 502 only when every
one failed, except that when they all answered the same 4xx (a key every
upstream refuses: 401) the first one's answer is relayed, since a 502 would
hide the real problem. Upstreams with the same URL, key and headers are
asked once. ``litellm_model`` upstreams have no model list to ask.

``/v1/models/{id}``: the upstreams are asked in the same order and the
first 200 is relayed; when none has it, the first upstream's answer.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from proxy.errors import ProxyError, UpstreamError
from proxy.http.body import error_response, forward_headers, relay_headers
from proxy.passthrough.model_shapes import (
    anthropic_list,
    anthropic_model,
    openai_model,
    wants_anthropic,
)
from proxy.runtime import Runtime
from proxy.telemetry.logging import get_logger
from proxy.upstream.base import UpstreamRequest

log = get_logger()

SKIPPED_HEADER = "x-ctxproxy-models-skipped"


@dataclass
class _Answer:
    upstream: str
    status: int | None = None
    headers: list[tuple[str, str]] | None = None
    body: bytes = b""
    error: str | None = None


async def models(request: Request) -> Response:
    runtime: Runtime = request.app.state.runtime
    # Pinned: a reload must not close an upstream while this call uses it.
    rt = runtime.pin()
    try:
        path = request.url.path.removeprefix("/v1")
        answers = await asyncio.gather(*(_ask(rt, request, n, path) for n in _compatible(rt)))
        anthropic = wants_anthropic(request.headers)
        if path.rstrip("/") == "/models":
            return _merged(answers, anthropic=anthropic)
        return _first_found(answers, anthropic=anthropic)
    finally:
        rt.release()


def _compatible(rt: Runtime) -> list[str]:
    """OpenAI-compatible upstreams in config order, one per (URL, key, headers)."""
    seen: set[tuple[Any, ...]] = set()
    names = []
    for name, config in rt.config.upstreams.items():
        if config.base_url is None:
            continue
        key = (config.base_url.rstrip("/"), config.api_key, tuple(sorted(config.headers.items())))
        if key not in seen:
            seen.add(key)
            names.append(name)
    return names


async def _ask(rt: Runtime, request: Request, name: str, path: str) -> _Answer:
    config = rt.config.upstreams[name]
    headers = forward_headers(request.headers.items(), config, rt.config.session.header)
    try:
        response = await rt.upstreams[name].send(
            UpstreamRequest(method="GET", path=path, headers=headers, query=request.url.query)
        )
        try:
            body = await response.read()
        finally:
            await response.close()
    except ProxyError as exc:
        return _Answer(name, error=exc.message)
    return _Answer(name, response.status, response.headers, body)


def _listed(answer: _Answer) -> list[Any] | None:
    if answer.status != 200:
        return None
    try:
        data = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return None
    listed = data.get("data") if isinstance(data, dict) else None
    return listed if isinstance(listed, list) else None


def _merged(answers: list[_Answer], *, anthropic: bool = False) -> Response:
    merged: list[Any] = []
    ids: set[str] = set()
    skipped: list[_Answer] = []
    for answer in answers:
        listed = _listed(answer)
        if listed is None:
            skipped.append(answer)
            reason = answer.error or f"status {answer.status}, not a model list"
            log.warning("models_upstream_skipped", upstream=answer.upstream, reason=reason)
            continue
        for model in listed:
            model_id = model.get("id") if isinstance(model, dict) else None
            if isinstance(model_id, str):
                if model_id in ids:
                    continue  # the first upstream listing an id wins
                ids.add(model_id)
            merged.append(model)
    if answers and len(skipped) == len(answers):
        return _all_failed(answers)
    headers = {SKIPPED_HEADER: ",".join(a.upstream for a in skipped)} if skipped else None
    if anthropic:
        entries = [anthropic_model(m) for m in merged if isinstance(m, dict)]
        body = orjson.dumps(anthropic_list(entries))
    else:
        data = [openai_model(m) if isinstance(m, dict) else m for m in merged]
        body = orjson.dumps({"object": "list", "data": data})
    return Response(body, media_type="application/json", headers=headers)


def _all_failed(answers: list[_Answer]) -> Response:
    statuses = {a.status for a in answers}
    first = answers[0]
    if len(statuses) == 1 and first.status is not None and 400 <= first.status < 500:
        return _relayed(first)  # every upstream refused the same way (a bad key): say that
    reasons = "; ".join(f"{a.upstream}: {a.error or f'status {a.status}'}" for a in answers)
    log.error("models_all_upstreams_failed", upstreams=[a.upstream for a in answers])
    return error_response(UpstreamError(f"No upstream could list its models ({reasons})."))


def _first_found(answers: list[_Answer], *, anthropic: bool = False) -> Response:
    for answer in answers:
        if answer.status == 200:
            return _relayed(_in_shape(answer, anthropic))
    for answer in answers:
        if answer.status is not None:
            return _relayed(answer)
    reasons = "; ".join(f"{a.upstream}: {a.error}" for a in answers)
    return error_response(UpstreamError(f"No upstream could be asked for this model ({reasons})."))


def _in_shape(answer: _Answer, anthropic: bool) -> _Answer:
    """One model's entry in the client's dialect (an entry that is not one: as it came)."""
    try:
        entry = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return answer
    if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
        return answer
    shaped = anthropic_model(entry) if anthropic else openai_model(entry)
    if shaped is entry:
        return answer
    headers = [(k, v) for k, v in answer.headers or [] if k.lower() != "content-type"]
    headers.append(("content-type", "application/json"))
    return _Answer(answer.upstream, answer.status, headers, orjson.dumps(shaped))


def _relayed(answer: _Answer) -> Response:
    assert answer.status is not None
    out = Response(answer.body, status_code=answer.status)
    out.raw_headers = relay_headers(answer.headers or [], {"content-length": str(len(answer.body))})
    return out
