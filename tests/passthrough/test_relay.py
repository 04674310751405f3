"""Every other /v1/... endpoint relayed unchanged: the openai SDK -> ctxproxy -> a recording fake."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.fakes.endpoints import AUDIO, FILE_CONTENT, FakeEndpoints
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config, query

CATCH_ALL = {
    "name": "other",
    "match": {"path": "/v1/*"},
    "upstream": "default",
    "policy": "passthrough",
}


@pytest.fixture
def endpoints(loop_thread: LoopThread) -> Iterator[tuple[FakeEndpoints, AiohttpServer]]:
    fake = FakeEndpoints()
    server = AiohttpServer(loop_thread, fake.app())
    yield fake, server
    server.stop()


@pytest.fixture
def relay_proxy(
    loop_thread: LoopThread, endpoints: tuple[FakeEndpoints, AiohttpServer], tmp_path: Path
) -> Iterator[Callable[..., ProxyServer]]:
    started: list[ProxyServer] = []

    def start(routes: list[dict[str, Any]] | None = None, **kwargs: Any) -> ProxyServer:
        config = make_config(endpoints[1].url, tmp_path, routes=routes or [CATCH_ALL], **kwargs)
        proxy = ProxyServer(loop_thread, config)
        started.append(proxy)
        return proxy

    yield start
    for proxy in started:
        proxy.stop()


def client(proxy: ProxyServer, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-client",
        default_headers={"X-Session-Id": "rag-1"},
        max_retries=0,
        **kw,
    )


def nothing_stored(proxy: ProxyServer, tmp_path: Path) -> None:
    proxy.drain()
    db = tmp_path / "ctxproxy.db"
    assert query(db, "SELECT count(*) AS n FROM requests")[0]["n"] == 0
    assert query(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 0


def test_embeddings_reach_upstream_byte_for_byte_and_back(endpoints, relay_proxy, tmp_path):
    fake, _ = endpoints
    proxy = relay_proxy()
    sent: list[bytes] = []
    hook = httpx.Client(event_hooks={"request": [lambda r: sent.append(r.read())]})
    raw = client(proxy, http_client=hook).embeddings.with_raw_response.create(
        model="text-embedding-3-small", input=["alpha", "beta"], encoding_format="float"
    )
    assert fake.received[-1].path == "/v1/embeddings"
    assert fake.received[-1].raw == sent[-1]  # the client's bytes, unchanged
    assert raw.http_response.content == fake.sent[-1]  # the upstream's bytes, unchanged
    assert raw.headers["x-request-id"] == "req_1"  # upstream headers relayed
    assert [d.embedding for d in raw.parse().data] == [[0.25, -0.5, 0.0], [0.25, -0.5, 1.0]]
    # The client's key goes upstream; the session header is the proxy's own.
    assert fake.received[-1].headers["Authorization"] == "Bearer sk-client"
    assert "X-Session-Id" not in fake.received[-1].headers
    nothing_stored(proxy, tmp_path)


def test_completions_moderations_images_batches(endpoints, relay_proxy, tmp_path):
    fake, _ = endpoints
    proxy = relay_proxy()
    c = client(proxy)
    assert (
        c.completions.create(model="gpt-3.5-turbo-instruct", prompt="hi").choices[0].text
        == "echo: hi"
    )
    assert c.moderations.create(input="fine").results[0].flagged is False
    assert c.images.generate(model="gpt-image-1", prompt="a cat").data[0].b64_json == "aGVsbG8="
    batch = c.batches.create(
        input_file_id="file-1", endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "validating"
    assert c.batches.retrieve("batch_1").id == "batch_1"
    assert c.batches.cancel("batch_1").status == "cancelling"
    assert [(r.method, r.path) for r in fake.received] == [
        ("POST", "/v1/completions"),
        ("POST", "/v1/moderations"),
        ("POST", "/v1/images/generations"),
        ("POST", "/v1/batches"),
        ("GET", "/v1/batches/batch_1"),
        ("POST", "/v1/batches/batch_1/cancel"),
    ]
    assert fake.received[0].json == {"model": "gpt-3.5-turbo-instruct", "prompt": "hi"}
    nothing_stored(proxy, tmp_path)


def test_query_strings_and_get_lists_are_relayed(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy()
    response = httpx.get(
        f"{proxy.url}/v1/batches?limit=2&after=batch_0", headers={"Authorization": "Bearer k"}
    )
    assert response.status_code == 200
    assert fake.received[-1].path == "/v1/batches?limit=2&after=batch_0"


def test_completions_stream_is_relayed_event_by_event(endpoints, relay_proxy, loop_thread):
    fake, _ = endpoints
    hold = loop_thread.run(_event())
    fake.hold = hold
    proxy = relay_proxy()
    stream = client(proxy).completions.create(
        model="gpt-3.5-turbo-instruct", prompt="count", stream=True
    )
    chunks = iter(stream)
    # The first event arrives while the upstream is still holding the rest back:
    # the proxy relays as it receives, it does not buffer the stream.
    assert next(chunks).choices[0].text == "one"
    loop_thread.loop.call_soon_threadsafe(hold.set)
    assert [c.choices[0].text for c in chunks] == [" two", " three"]


def test_streamed_completion_bytes_are_unchanged(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy()
    with httpx.stream(
        "POST", f"{proxy.url}/v1/completions", json={"model": "m", "prompt": "p", "stream": True}
    ) as r:
        body = b"".join(r.iter_raw())
        assert r.headers["content-type"] == "text/event-stream"
    assert body == fake.sent[-1]


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_audio_speech_binary_answer_streams_through(endpoints, relay_proxy, loop_thread):
    fake, _ = endpoints
    hold = loop_thread.run(_event())
    fake.hold = hold
    proxy = relay_proxy()
    with client(proxy).audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="hello"
    ) as r:
        assert r.headers["content-type"] == "audio/mpeg"
        assert r.headers["content-length"] == str(
            len(AUDIO)
        )  # relayed: the bytes are the upstream's
        parts = r.iter_bytes()
        first = next(parts)  # half the audio, before the upstream sent the rest
        loop_thread.loop.call_soon_threadsafe(hold.set)
        assert first + b"".join(parts) == AUDIO


def test_file_upload_multipart_is_streamed_unchanged(endpoints, relay_proxy, tmp_path):
    fake, _ = endpoints
    # A body limit far below the upload: multipart bodies are streamed, not buffered.
    proxy = relay_proxy(extra={"server": {"max_body_bytes": 1024}})
    sent: list[httpx.Request] = []
    hook = httpx.Client(event_hooks={"request": [sent.append]})
    content = b'{"custom_id": "x", "body": {}}\n' * 4000  # 128 KB
    created = client(proxy, http_client=hook).files.create(
        file=("batch.jsonl", io.BytesIO(content)), purpose="batch"
    )
    received = fake.received[-1]
    assert created.id.startswith("file-")
    assert received.path == "/v1/files"
    assert received.raw == sent[-1].read()  # multipart body byte for byte, boundary included
    assert received.headers["Content-Type"] == sent[-1].headers["content-type"]
    assert received.headers["Content-Length"] == str(len(received.raw))  # not re-chunked
    assert content in received.raw
    # The file's content comes back as bytes.
    assert client(proxy).files.content(created.id).content == FILE_CONTENT
    nothing_stored(proxy, tmp_path)


def test_json_body_over_the_limit_is_refused_in_openai_shape(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy(extra={"server": {"max_body_bytes": 1024}})
    with pytest.raises(openai.APIStatusError) as caught:
        client(proxy).embeddings.create(model="m", input="x" * 5000)
    assert caught.value.status_code == 413
    assert caught.value.body["code"] == "request_too_large"  # type: ignore[index]
    assert fake.received == []


def test_audio_transcription_and_uploads_parts(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy()
    c = client(proxy)
    text = c.audio.transcriptions.create(model="whisper-1", file=("a.mp3", io.BytesIO(AUDIO))).text
    assert text.startswith("heard ")
    assert AUDIO in fake.received[-1].raw
    upload = c.uploads.create(bytes=10, filename="f.jsonl", mime_type="text/jsonl", purpose="batch")
    part = c.uploads.parts.create(upload.id, data=b"0123456789")
    done = c.uploads.complete(upload.id, part_ids=[part.id])
    assert done.status == "completed"
    assert [r.path for r in fake.received[-3:]] == [
        "/v1/uploads",
        "/v1/uploads/upload_1/parts",
        "/v1/uploads/upload_1/complete",
    ]
    assert b"0123456789" in fake.received[-2].raw


def test_error_status_and_headers_are_relayed(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy()
    response = httpx.post(f"{proxy.url}/v1/rate-limited", json={"model": "m"})
    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.content == fake.sent[-1]


def test_unrouted_path_is_a_404_in_openai_shape(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy(routes=[{"match": {"path": "/v1/chat/completions"}, "upstream": "default"}])
    with pytest.raises(openai.NotFoundError) as caught:
        client(proxy).embeddings.create(model="m", input="x")
    body = caught.value.body
    assert isinstance(body, dict) and body["code"] == "route_not_found"
    assert "/v1/embeddings" in body["message"]
    assert fake.received == []


def test_routes_match_path_globs_headers_and_json_model(loop_thread, endpoints, tmp_path):
    fake, server = endpoints
    other = FakeEndpoints()
    other_server = AiohttpServer(loop_thread, other.app())
    try:
        config = make_config(
            server.url,
            tmp_path,
            extra={
                "upstreams": {
                    "default": {"base_url": f"{server.url}/v1"},
                    "local": {"base_url": f"{other_server.url}/v1"},
                }
            },
            routes=[
                {"match": {"path": "/v1/embeddings", "model": "local-*"}, "upstream": "local"},
                {
                    "match": {"path": "/v1/audio/*", "headers": {"X-Tier": "local"}},
                    "upstream": "local",
                },
                CATCH_ALL,
            ],
        )
        proxy = ProxyServer(loop_thread, config)
        try:
            c = client(proxy)
            c.embeddings.create(model="local-e5", input="a")
            c.embeddings.create(model="text-embedding-3-small", input="b")
            c.audio.speech.create(
                model="tts-1", voice="alloy", input="x", extra_headers={"X-Tier": "local"}
            )
            c.audio.speech.create(model="tts-1", voice="alloy", input="y")
        finally:
            proxy.stop()
        assert [r.path for r in other.received] == ["/v1/embeddings", "/v1/audio/speech"]
        assert [r.path for r in fake.received] == ["/v1/embeddings", "/v1/audio/speech"]
        assert other.received[0].json["model"] == "local-e5"
    finally:
        other_server.stop()


def test_unreachable_upstream_is_a_502_naming_it(loop_thread, tmp_path):
    config = make_config("http://127.0.0.1:9", tmp_path, routes=[CATCH_ALL])
    proxy = ProxyServer(loop_thread, config)
    try:
        response = httpx.post(f"{proxy.url}/v1/embeddings", json={"model": "m", "input": "x"})
    finally:
        proxy.stop()
    assert response.status_code == 502
    error = response.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert "'default'" in error["message"] and "127.0.0.1:9" in error["message"]


def test_upstream_dying_midway_leaves_the_body_truncated(loop_thread, tmp_path):
    from aiohttp import web

    async def dies(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "audio/mpeg"})
        response.content_length = 1000
        await response.prepare(request)
        await response.write(b"x" * 100)
        assert request.transport is not None
        request.transport.close()
        return response

    app = web.Application()
    app.router.add_post("/v1/audio/speech", dies)
    server = AiohttpServer(loop_thread, app)
    proxy = ProxyServer(loop_thread, make_config(server.url, tmp_path, routes=[CATCH_ALL]))
    try:
        with pytest.raises(httpx.HTTPError):  # never a "complete" 100-byte answer
            httpx.post(
                f"{proxy.url}/v1/audio/speech", json={"model": "tts-1", "input": "x", "voice": "a"}
            )
    finally:
        proxy.stop()
        server.stop()


def test_litellm_upstream_refuses_other_endpoints_clearly(endpoints, tmp_path, loop_thread):
    config = make_config(
        endpoints[1].url,
        tmp_path,
        extra={
            "upstreams": {
                "claude": {"litellm_model": "anthropic/claude-sonnet-4-5", "api_key": "k"}
            }
        },
        routes=[{"match": {"path": "/v1/*"}, "upstream": "claude"}],
    )
    proxy = ProxyServer(loop_thread, config)
    try:
        response = httpx.post(f"{proxy.url}/v1/moderations", json={"model": "m", "input": "x"})
    finally:
        proxy.stop()
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_endpoint"
    assert "litellm_model" in error["message"] and "'claude'" in error["message"]


def test_chat_and_proxy_endpoints_still_take_precedence(endpoints, relay_proxy):
    fake, _ = endpoints
    proxy = relay_proxy()
    assert httpx.get(f"{proxy.url}/healthz").json() == {"status": "ok"}
    # GET on a POST-only pipeline path is relayed (stored completions live upstream).
    response = httpx.get(f"{proxy.url}/v1/chat/completions?limit=1")
    assert (
        fake.received[-1].method == "GET"
        and fake.received[-1].path == "/v1/chat/completions?limit=1"
    )
    assert response.status_code == 404  # the fake's own answer, relayed
    assert orjson.loads(response.content) == orjson.loads(fake.sent[-1])


def test_concurrent_streams_do_not_mix(endpoints, relay_proxy):
    _fake, _ = endpoints
    proxy = relay_proxy()
    results: list[bytes] = []

    def fetch() -> None:
        with httpx.stream(
            "POST",
            f"{proxy.url}/v1/audio/speech",
            json={"model": "tts-1", "input": "x", "voice": "a"},
        ) as r:
            results.append(b"".join(r.iter_bytes()))

    threads = [threading.Thread(target=fetch) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [AUDIO] * 8


def test_embeddings_through_a_litellm_upstream_are_translated(endpoints, tmp_path, loop_thread):
    fake, server = endpoints
    config = make_config(
        server.url,
        tmp_path,
        extra={
            "upstreams": {
                "embed": {
                    "litellm_model": "openai/text-embedding-3-small",
                    "api_base": f"{server.url}/v1",
                    "api_key": "sk-provider",
                }
            }
        },
        routes=[{"match": {"path": "/v1/embeddings"}, "upstream": "embed"}],
    )
    proxy = ProxyServer(loop_thread, config)
    try:
        result = client(proxy).embeddings.create(
            model="my-embedder", input=["a", "b"], encoding_format="float"
        )
    finally:
        proxy.stop()
    assert [d.embedding for d in result.data] == [[0.25, -0.5, 0.0], [0.25, -0.5, 1.0]]
    assert result.model == "my-embedder"  # the client's name for it
    (call,) = fake.received
    assert call.path == "/v1/embeddings"
    assert call.json["model"] == "text-embedding-3-small" and call.json["input"] == ["a", "b"]
    assert call.headers["Authorization"] == "Bearer sk-provider"
