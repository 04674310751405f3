"""The admin API: 401 without the key, paged listing, session view, delete, JSON Lines export."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest

from proxy.config.loader import parse_config
from proxy.errors import ConfigError
from proxy.http.sessions import tenant_of
from proxy.ops.admin_views import summarized_positions
from proxy.ops.replay import load_file
from tests.harness import query

ADMIN_KEY = "adm-0123456789"
ADMIN = {"admin": {"api_key": "os.environ/CTX_ADMIN_KEY"}}
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
LAST1 = {
    "policies": {"last1": {"strategy": "trim", "max_turns": 1}},
    "routes": [
        {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "last1"}
    ],
}

# Past two turns, all but the newest are summarized, offline and deterministically.
SUMMARIZE = {
    "policies": {
        "fold": {
            "strategy": "summarize",
            "trigger": {"turns": 2},
            "keep_last_turns": 1,
            "prefetch": False,
            "summarizer": {"model": "ctxproxy/extractive"},
        }
    },
    "routes": [
        {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "fold"}
    ],
}


def chat(proxy: Any, session: str, messages: list[dict[str, Any]], key: str = "sk-a") -> Any:
    c = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key=key,
        max_retries=0,
        default_headers={"X-Session-Id": session},
    )
    return c.chat.completions.create(model="gpt-4o", messages=messages)


def conversation(proxy: Any, session: str, turns: int, key: str = "sk-a") -> list[dict[str, Any]]:
    """``turns`` requests, each resending the history plus a new question; the full history."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for t in range(turns):
        messages.append({"role": "user", "content": f"{session} question {t}"})
        reply = chat(proxy, session, messages, key)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return messages


def stored(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the store keeps it: the reply as the upstream sent it (refusal: null)."""
    return {k: v for k, v in message.items() if v is not None}


def get(proxy: Any, path: str, **kw: Any) -> httpx.Response:
    return httpx.get(f"{proxy.url}{path}", **kw)


ADMIN_CALLS = [
    ("GET", "/admin/sessions"),
    ("GET", "/admin/sessions/t/k"),
    ("DELETE", "/admin/sessions/t/k"),
    ("GET", "/admin/sessions/t/k/export"),
    ("GET", "/admin/requests/r"),
    ("GET", "/admin/calibration"),
    ("POST", "/admin/anything/else"),
]


def test_admin_disabled_answers_401_on_every_admin_path(start_proxy):
    proxy = start_proxy()
    for method, path in ADMIN_CALLS:
        r = httpx.request(method, f"{proxy.url}{path}", headers=AUTH)
        assert r.status_code == 401, (method, path)
        assert r.json()["error"]["code"] == "admin_disabled"
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["www-authenticate"].startswith("Bearer")


def test_missing_or_wrong_admin_key_is_401(admin_proxy):
    proxy = admin_proxy()
    conversation(proxy, "s", 1)
    proxy.drain()
    tenant = tenant_of("sk-a")
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {ADMIN_KEY}x"},
        {"Authorization": "Bearer sk-a"},
        {"Authorization": ADMIN_KEY},
    ):
        for method, path in [*ADMIN_CALLS, ("DELETE", f"/admin/sessions/{tenant}/s")]:
            r = httpx.request(method, f"{proxy.url}{path}", headers=headers)
            assert r.status_code == 401, (headers, method, path)
            assert r.json()["error"]["code"] == "invalid_api_key"
    proxy.drain()
    assert query(proxy.config.store.path, "SELECT COUNT(*) FROM sessions")[0][0] == 1
    assert get(proxy, f"/admin/sessions/{tenant}/s", headers=AUTH).status_code == 200


def test_admin_key_must_be_an_environment_reference():
    base = {
        "upstreams": {"d": {"base_url": "http://127.0.0.1:9/v1"}},
        "routes": [{"upstream": "d"}],
    }
    with pytest.raises(ConfigError) as info:
        parse_config({**base, "admin": {"api_key": "literal-key"}})
    assert str(info.value).startswith("admin.api_key: must be an os.environ/NAME reference")
    with pytest.raises(ConfigError, match=r"admin\.api_key: environment variable CTX_NOPE"):
        parse_config({**base, "admin": {"api_key": "os.environ/CTX_NOPE"}})
    assert parse_config(base).admin.api_key is None


def test_sessions_are_listed_newest_first_in_pages(admin_proxy):
    proxy = admin_proxy()
    for n in range(5):
        conversation(proxy, f"s{n}", n + 1)
        proxy.drain()  # distinct, ordered last-activity times
    conversation(proxy, "other-tenant", 1, key="sk-b")
    proxy.drain()
    tenant = tenant_of("sk-a")
    first = get(proxy, f"/admin/sessions?limit=2&tenant={tenant}", headers=AUTH).json()
    assert [s["key"] for s in first["data"]] == ["s4", "s3"]
    assert first["has_more"] is True and first["limit"] == 2 and first["offset"] == 0
    rest = get(proxy, f"/admin/sessions?limit=2&offset=4&tenant={tenant}", headers=AUTH).json()
    assert [s["key"] for s in rest["data"]] == ["s0"]
    assert rest["has_more"] is False
    everyone = get(proxy, "/admin/sessions", headers=AUTH).json()["data"]
    assert [s["key"] for s in everyone][:2] == ["other-tenant", "s4"]
    assert {s["tenant"] for s in everyone} == {tenant, tenant_of("sk-b")}
    s4 = everyone[1]
    # 5 questions, 5 replies and the system message on the current branch.
    assert (s4["turns"], s4["messages"], s4["request_count"]) == (5, 11, 5)
    assert s4["stored_tokens"] > 0
    assert s4["last_activity"] >= s4["created_at"]
    assert s4["last_activity"] >= everyone[2]["last_activity"]


def test_bad_paging_parameters_are_400(admin_proxy):
    proxy = admin_proxy()
    for query_string in ("limit=0", "limit=501", "limit=x", "offset=-1", "offset=1.5"):
        r = get(proxy, f"/admin/sessions?{query_string}", headers=AUTH)
        assert r.status_code == 400, query_string
        assert r.json()["error"]["param"] == query_string.split("=")[0]


def test_session_view_explains_what_each_request_forwarded_and_dropped(admin_proxy):
    proxy = admin_proxy(**LAST1)
    messages = conversation(proxy, "audit/1", 3)
    proxy.drain()
    tenant = tenant_of("sk-a")
    r = get(proxy, f"/admin/sessions/{tenant}/audit/1", headers=AUTH)
    assert r.status_code == 200
    view = r.json()
    assert (view["key"], view["tenant"], view["turns"]) == ("audit/1", tenant, 3)
    assert [stored(item["message"]) for item in view["history"]] == messages
    assert view["summaries"] == []
    requests = view["requests"]
    assert [r["policy"] for r in requests] == ["last1"] * 3
    assert [r["status"] for r in requests] == [200, 200, 200]
    first, _, last = requests
    assert first["dropped"]["messages"] == 0 and first["dropped"]["reason"] is None
    # The third request dropped the first two turns (4 messages) under max_turns.
    assert last["dropped"]["reason"] == "max_turns"
    assert (last["dropped"]["turns"], last["dropped"]["messages"]) == (2, 4)
    ids = {item["message"]["content"]: item["id"] for item in view["history"]}
    assert last["dropped"]["item_ids"] == [
        ids["audit/1 question 0"],
        ids["echo: audit/1 question 0"],
        ids["audit/1 question 1"],
        ids["echo: audit/1 question 1"],
    ]
    assert last["tokens"]["saved"] == last["tokens"]["before"] - last["tokens"]["after"] > 0
    assert last["latency_ms"]["total"] >= last["latency_ms"]["upstream"] > 0
    assert last["usage"]["completion_tokens"] == 5
    # "Why did the model forget question 0?": the request that first left it out.
    by_content = {item["message"]["content"]: item for item in view["history"]}
    assert by_content["audit/1 question 0"]["first_dropped_by"] == requests[1]["id"]
    assert by_content["audit/1 question 0"]["dropped_in_last_request"] is True
    assert by_content["audit/1 question 2"]["first_dropped_by"] is None
    one = get(proxy, f"/admin/requests/{last['id']}", headers=AUTH).json()
    assert one == last


def test_unknown_session_and_request_are_404(admin_proxy):
    proxy = admin_proxy()
    for path in ("/admin/sessions/t/nope", "/admin/sessions/t/nope/export", "/admin/requests/x"):
        r = get(proxy, path, headers=AUTH)
        assert r.status_code == 404, path
    assert httpx.delete(f"{proxy.url}/admin/sessions/t/nope", headers=AUTH).status_code == 404


def test_deleting_a_session_leaves_no_row_behind(admin_proxy):
    proxy = admin_proxy(**LAST1)
    conversation(proxy, "doomed", 3)
    conversation(proxy, "kept", 2)
    proxy.drain()
    db = proxy.config.store.path
    tenant = tenant_of("sk-a")
    r = httpx.delete(f"{proxy.url}/admin/sessions/{tenant}/doomed", headers=AUTH)
    assert r.status_code == 200
    assert r.json() == {
        "object": "session.deleted",
        "tenant": tenant,
        "key": "doomed",
        "deleted": True,
    }
    assert [row["key"] for row in query(db, "SELECT key FROM sessions")] == ["kept"]
    kept_id = query(db, "SELECT id FROM sessions")[0]["id"]
    assert query(db, "SELECT COUNT(*) FROM items WHERE session_id != ?", kept_id)[0][0] == 0
    assert query(db, "SELECT COUNT(*) FROM requests WHERE session_key = 'doomed'")[0][0] == 0
    assert query(db, "SELECT COUNT(*) FROM requests")[0][0] == 2
    assert get(proxy, f"/admin/sessions/{tenant}/doomed", headers=AUTH).status_code == 404
    assert (
        httpx.delete(f"{proxy.url}/admin/sessions/{tenant}/doomed", headers=AUTH).status_code == 404
    )


def test_export_is_json_lines_that_replay_reads_back(admin_proxy, tmp_path):
    proxy = admin_proxy()
    messages = conversation(proxy, "exp", 2)
    proxy.drain()
    r = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/exp/export", headers=AUTH)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/x-ndjson"
    lines = [orjson.loads(line) for line in r.content.splitlines()]
    assert r.content.endswith(b"\n")
    assert [line["type"] for line in lines] == ["session"] + ["item"] * 5 + ["request"] * 2
    assert [stored(line["message"]) for line in lines if line["type"] == "item"] == messages
    assert lines[0]["key"] == "exp" and lines[0]["request_count"] == 2
    path = tmp_path / "exp.jsonl"
    path.write_bytes(r.content)
    [loaded] = load_file(path)
    assert loaded.name == "exp"
    assert [stored(m) for m in loaded.messages] == messages


def test_calibration_is_visible_in_the_admin_api(admin_proxy):
    proxy = admin_proxy()
    conversation(proxy, "cal", 6)
    proxy.drain()
    data = get(proxy, "/admin/calibration", headers=AUTH).json()["data"]
    assert [(c["model"], c["samples"], c["applied"]) for c in data] == [("gpt-4o", 6, True)]
    # The fake counts prompts exactly as tiktoken does.
    assert data[0]["factor"] == 1.0
    view = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/cal", headers=AUTH).json()
    assert view["calibration"] == data


def summarized_session(proxy: Any, session: str = "sum") -> list[dict[str, Any]]:
    """Four requests under SUMMARIZE: the third makes a summary, the fourth reuses it."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for t in range(4):
        messages.append({"role": "user", "content": f"Order #{4410 + t} is late. Turn {t}."})
        reply = chat(proxy, session, messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        proxy.drain()
    return messages


def test_session_view_shows_summaries_and_what_each_request_summarized(admin_proxy):
    proxy = admin_proxy(**SUMMARIZE)
    summarized_session(proxy)
    view = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/sum", headers=AUTH).json()
    ids = [item["id"] for item in view["history"]]
    # The summary covers turns 0 and 1 (messages 1-4), up to the reply to turn 1.
    (summary,) = view["summaries"]
    assert summary["covers_item_id"] == ids[4] and summary["start_unit"] == 0
    assert summary["on_current_branch"] is True and summary["previous_summary_id"] is None
    assert summary["model"] == "ctxproxy/extractive" and summary["prompt_hash"]
    assert summary["text"].splitlines()[0] == "- user: Order #4410 is late."
    assert {"kind": "id", "value": "Order #4410"} in summary["facts"]
    assert summary["flagged"] == []
    requests = view["requests"]
    assert summary["used_by"] == [requests[2]["id"], requests[3]["id"]]
    assert [r["summarized"]["status"] for r in requests] == ["none", "none", "created", "reused"]
    for r in requests[:2]:
        assert r["summarized"]["summary_id"] is None and r["summarized"]["item_ids"] == []
    for r in requests[2:]:
        used = r["summarized"]
        assert used["summary_id"] == summary["id"]
        assert (used["turns"], used["indexes"], used["item_ids"]) == (2, [1, 2, 3, 4], ids[1:5])
        assert used["tokens"] > 0 and used["placement"] == "system"
        assert r["dropped"]["reason"] == "summarized"
    assert requests[2]["summarized"]["wait_ms"] >= 0
    # "Why did the model forget turn 0?": it did not; request 3 summarized it.
    by_item = {item["id"]: item for item in view["history"]}
    assert [by_item[i]["first_summarized_by"] for i in ids[1:5]] == [requests[2]["id"]] * 4
    assert [by_item[i]["first_summarized_by"] for i in (ids[0], *ids[5:])] == [None] * 5


def test_export_has_a_summary_line_per_summary(admin_proxy, tmp_path):
    proxy = admin_proxy(**SUMMARIZE)
    messages = summarized_session(proxy, "exp-sum")
    r = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/exp-sum/export", headers=AUTH)
    lines = [orjson.loads(line) for line in r.content.splitlines()]
    types = [line["type"] for line in lines]
    assert types == ["session"] + ["item"] * 9 + ["summary"] + ["request"] * 4
    (summary,) = [line for line in lines if line["type"] == "summary"]
    items = [line for line in lines if line["type"] == "item"]
    assert summary["covers_item_id"] == items[4]["id"]
    assert summary["text"].startswith("- user: Order #4410 is late.")
    assert summary["model"] == "ctxproxy/extractive"
    assert {"kind": "id", "value": "Order #4410"} in summary["facts"]
    for key in ("start_unit", "flagged", "prompt_hash", "usage", "previous_summary_id"):
        assert key in summary, key
    # The export still replays: summary lines are not messages.
    path = tmp_path / "exp-sum.jsonl"
    path.write_bytes(r.content)
    assert [stored(m) for m in load_file(path)[0].messages] == messages


def test_summarized_positions_leave_out_repaired_orphans_and_trimmed_opening_turns():
    # Twelve messages: 1-2 an opening turn trimmed for the budget, 3 an orphan
    # repaired, 4-7 summarized (covers 8), 8-11 kept.
    row = {
        "dropped_spans": [[1, 8]],
        "detail": {
            "repaired": [3],
            "dropped_by": {"summarized": 4, "max_tokens": 2, "orphan": 1},
            "summary": {"status": "reused", "covers": 8, "units": 2},
        },
    }
    assert summarized_positions(row) == [4, 5, 6, 7]
    no_summary = {**row, "detail": {**row["detail"], "dropped_by": {"summarized": 0}}}
    assert summarized_positions(no_summary) == []
    trimmed = {**row, "detail": {"repaired": [], "clipped": []}}
    assert summarized_positions(trimmed) == []
