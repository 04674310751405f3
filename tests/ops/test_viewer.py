"""The viewer's page and the admin API it reads, over real HTTP: files, headers, the
``?session=`` filter, each request's token split and its context item by item."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from proxy.http.sessions import tenant_of
from proxy.ops.timeline import context_entries, masked_by_index, recall_of, token_split
from proxy.ops.viewer import ASSETS, CSP, page_bytes
from proxy.store.base import StoredItem
from tests.ops.test_admin import (
    AUTH,
    LAST1,
    SUMMARIZE,
    chat,
    conversation,
    get,
    summarized_session,
)

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "proxy" / "ops" / "static"

# Tool results over 40 tokens are clipped; nothing is dropped.
CLIP = {
    "policies": {"clip": {"strategy": "trim", "max_turns": 50, "tool_output_max_tokens": 40}},
    "routes": [
        {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "clip"}
    ],
}


def test_the_page_is_served_without_a_key_with_a_strict_content_security_policy(admin_proxy):
    proxy = admin_proxy()
    page = get(proxy, "/admin/ui")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CSP
    assert "script-src 'self'" in CSP and "unsafe-inline" not in CSP
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    # Relative URLs, so a path prefix in front of the proxy keeps working.
    assert 'src="ui/viewer.js"' in page.text and 'href="ui/viewer.css"' in page.text
    for name, media in (("viewer.css", "text/css"), ("viewer.js", "text/javascript")):
        r = get(proxy, f"/admin/ui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(media)
        assert r.content == (STATIC / name).read_bytes()
        again = get(proxy, f"/admin/ui/{name}", headers={"If-None-Match": r.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    assert get(proxy, "/admin/ui/nope.js").status_code == 404
    slash = get(proxy, "/admin/ui/")
    assert slash.status_code == 308 and slash.headers["location"] == "../ui"


def test_the_page_is_not_served_when_the_admin_api_is_disabled(start_proxy):
    proxy = start_proxy()
    for path in ("/admin/ui", "/admin/ui/viewer.js", "/admin/ui/viewer.css"):
        r = get(proxy, path)
        assert r.status_code == 401, path
        assert r.json()["error"]["code"] == "admin_disabled"


def test_the_page_is_under_100_kb_and_ships_as_package_data():
    assert set(ASSETS) == {"", "viewer.css", "viewer.js"}
    on_disk = sum(p.stat().st_size for p in STATIC.iterdir())
    assert page_bytes() == on_disk < 100 * 1024
    # A non-editable install carries the files: pyproject's package-data names each.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["proxy.ops"]
    for path in STATIC.iterdir():
        assert any(fnmatch(f"static/{path.name}", g) for g in globs), path.name


def test_the_script_never_parses_data_as_html_logs_or_loads_from_elsewhere():
    script = (STATIC / "viewer.js").read_text()
    for sink in (".innerHTML", ".outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert sink not in script, sink
    assert not re.search(r"\bconsole\s*[.\[]", script)
    for name in ("viewer.html", "viewer.css", "viewer.js"):
        text = (STATIC / name).read_text()
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text), name
    # The key lives in sessionStorage (this tab), never localStorage or a cookie.
    assert "sessionStorage" in script
    assert "localStorage" not in script and "document.cookie" not in script


def test_admin_json_is_never_cached(admin_proxy):
    proxy = admin_proxy()
    conversation(proxy, "nc", 1)
    proxy.drain()
    assert get(proxy, "/admin/sessions", headers=AUTH).headers["cache-control"] == "no-store"


def test_sessions_are_found_by_part_of_their_id_without_the_tenant(admin_proxy):
    proxy = admin_proxy()
    conversation(proxy, "ticket-1042", 1, key="sk-a")
    proxy.drain()
    conversation(proxy, "ticket-10420", 1, key="sk-b")
    proxy.drain()
    conversation(proxy, "other", 1, key="sk-a")
    proxy.drain()
    found = get(proxy, "/admin/sessions?session=ticket-1042", headers=AUTH).json()
    assert [(s["key"], s["tenant"]) for s in found["data"]] == [
        ("ticket-10420", tenant_of("sk-b")),
        ("ticket-1042", tenant_of("sk-a")),
    ]
    assert found["has_more"] is False
    page = get(proxy, "/admin/sessions?session=ticket&limit=1", headers=AUTH).json()
    assert [s["key"] for s in page["data"]] == ["ticket-10420"] and page["has_more"] is True
    mine = get(
        proxy, f"/admin/sessions?session=ticket&tenant={tenant_of('sk-a')}", headers=AUTH
    ).json()
    assert [s["key"] for s in mine["data"]] == ["ticket-1042"]
    # Not a pattern: "%" and "_" match only themselves.
    assert get(proxy, "/admin/sessions?session=%25", headers=AUTH).json()["data"] == []
    assert get(proxy, "/admin/sessions?session=", headers=AUTH).json()["data"][0]["key"] == "other"
    assert get(proxy, "/admin/sessions?session=x").status_code == 401


def split_sums(request: dict[str, Any]) -> tuple[int, int]:
    split = request["tokens"]["split"]
    return sum(split["sent"].values()), sum(split["forwarded"].values())


def test_each_request_splits_its_tokens_by_what_became_of_them(admin_proxy):
    proxy = admin_proxy(**LAST1)
    conversation(proxy, "split", 3)
    proxy.drain()
    view = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/split", headers=AUTH).json()
    tokens = {item["id"]: item["token_count"] for item in view["history"]}
    for request in view["requests"]:
        t = request["tokens"]
        assert split_sums(request) == (t["before"], t["after"])
        split = t["split"]
        assert split["exact"] is True
        dropped = sum(tokens[i] for i in request["dropped"]["item_ids"])
        assert split["sent"]["dropped"] == dropped
        # What the messages do not account for (reply priming) is the same on both sides.
        assert split["sent"]["other"] == split["forwarded"]["other"] >= 0
        assert (
            split["sent"]["kept"]
            == split["forwarded"]["kept"]
            == t["after"] - split["sent"]["other"]
        )
    assert view["requests"][-1]["tokens"]["split"]["sent"]["dropped"] > 0
    # Neither recall nor masking ran for this policy.
    assert view["requests"][-1]["recalled"] is None and view["requests"][-1]["masked"] == []


def test_a_request_context_lists_every_message_with_its_fate(admin_proxy):
    proxy = admin_proxy(**LAST1)
    messages = conversation(proxy, "ctx", 3)
    proxy.drain()
    view = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/ctx", headers=AUTH).json()
    last = view["requests"][-1]
    r = get(proxy, f"/admin/requests/{last['id']}/context", headers=AUTH)
    assert r.status_code == 200 and r.headers["cache-control"] == "no-store"
    ctx = r.json()
    assert ctx["object"] == "request.context" and ctx["chain"] == "current_branch"
    assert ctx["request"] == last
    entries = ctx["entries"]
    assert [e["index"] for e in entries] == list(range(len(messages) - 1))
    assert [e["fate"] for e in entries] == ["kept"] + ["dropped"] * 4 + ["kept"]
    assert [e["message"]["content"] for e in entries] == [m["content"] for m in messages[:-1]]
    assert {e["reason"] for e in entries if e["fate"] == "dropped"} == {"max_turns"}
    assert [e["item_id"] for e in entries] == [item["id"] for item in view["history"][:-1]]
    assert all(e["tokens_forwarded"] == 0 for e in entries if e["fate"] == "dropped")
    assert (
        sum(e["tokens_forwarded"] for e in entries) == last["tokens"]["split"]["forwarded"]["kept"]
    )
    assert ctx["reply"]["message"]["content"] == messages[-1]["content"]
    assert get(proxy, "/admin/requests/nope/context", headers=AUTH).status_code == 404
    assert get(proxy, f"/admin/requests/{last['id']}/context").status_code == 401


def test_a_summarized_request_shows_the_summary_where_it_stood_in(admin_proxy):
    proxy = admin_proxy(**SUMMARIZE)
    summarized_session(proxy, "sum-ctx")
    view = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/sum-ctx", headers=AUTH).json()
    (summary,) = view["summaries"]
    last = view["requests"][-1]
    split = last["tokens"]["split"]
    assert split_sums(last) == (last["tokens"]["before"], last["tokens"]["after"])
    history_tokens = {item["id"]: item["token_count"] for item in view["history"]}
    assert split["sent"]["summarized"] == sum(
        history_tokens[i] for i in last["summarized"]["item_ids"]
    )
    assert split["forwarded"]["summary"] == last["summarized"]["tokens"] > 0
    ctx = get(proxy, f"/admin/requests/{last['id']}/context", headers=AUTH).json()
    kinds = [e.get("fate", e["kind"]) for e in ctx["entries"]]
    assert kinds == ["kept", "summary"] + ["summarized"] * 4 + ["kept"] * 3
    block = ctx["entries"][1]
    assert block["summary_id"] == summary["id"] and block["text"] == summary["text"]
    assert block["facts"] == summary["facts"] and block["flagged"] == summary["flagged"]
    assert block["stands_in_for"] == 4 and block["turns"] == 2


def test_a_clipped_tool_result_is_counted_at_both_sizes(admin_proxy):
    proxy = admin_proxy(**CLIP)
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Look up order 1234."},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "status shipped " * 200},
        {"role": "user", "content": "And?"},
    ]
    chat(proxy, "clip", messages)
    proxy.drain()
    view = get(proxy, f"/admin/sessions/{tenant_of('sk-a')}/clip", headers=AUTH).json()
    (request,) = view["requests"]
    (clip,) = request["clipped"]
    split = request["tokens"]["split"]
    assert split["sent"]["clipped"] == clip["tokens_before"]
    assert split["forwarded"]["clipped"] == clip["tokens_after"] < clip["tokens_before"]
    assert split_sums(request) == (request["tokens"]["before"], request["tokens"]["after"])
    ctx = get(proxy, f"/admin/requests/{request['id']}/context", headers=AUTH).json()
    tool = ctx["entries"][clip["index"]]
    assert (tool["fate"], tool["tokens"], tool["tokens_forwarded"]) == (
        "clipped",
        clip["tokens_before"],
        clip["tokens_after"],
    )


def test_recalled_turns_are_split_out_of_the_dropped_ones_and_forwarded_as_one_block():
    # Ten messages; the policy dropped 1-6; recall brought back 3-4 (hit 3) as a 30-token block.
    row = {
        "messages_before": 10,
        "tokens_before": 103,
        "tokens_after": 3 + 10 * 4 + 30,
        "dropped_spans": [[1, 7]],
        "reason": "max_turns",
        "detail": {
            "recall": {
                "status": "recalled",
                "tokens": 30,
                "budget": 200,
                "spans": [[3, 5], "junk", [7, 2]],
                "hits": [[3, 44, 0.8123], ["x"]],
            }
        },
    }
    chain = [stored_item(i, role="user" if i % 2 else "assistant") for i in range(10)]
    recall = recall_of(row["detail"])
    assert recall is not None and recall.units == ((3, 5),) and recall.indexes == [3, 4]
    split = token_split(row, chain, [], None)
    assert split["sent"] == {
        "kept": 40,
        "clipped": 0,
        "masked": 0,
        "summarized": 0,
        "recalled": 20,
        "dropped": 40,
        "other": 3,
    }
    assert split["forwarded"] == {
        "kept": 40,
        "clipped": 0,
        "masked": 0,
        "recalled": 30,
        "summary": 0,
        "other": 3,
    }
    entries = context_entries(row, chain, [], None)
    fates = [e.get("fate", e["kind"]) for e in entries]
    # The block stands before the newest user message (9).
    assert fates == ["kept"] + ["dropped"] * 2 + ["recalled"] * 2 + ["dropped"] * 2 + [
        "kept",
        "kept",
        "recall",
        "kept",
    ]
    assert [e.get("score") for e in entries if e.get("fate") == "recalled"] == [0.8123, None]
    assert entries[-2] == {"kind": "recall", "tokens": 30, "turns": 1, "indexes": [3, 4]}
    assert recall_of({"recall": "x"}) is None and recall_of({}) is None


def test_masked_tool_results_are_read_from_the_row():
    masked = masked_by_index({"masked": [{"index": 4, "tokens_before": 90, "tokens_after": 9}]})
    assert (masked[4].tokens_before, masked[4].tokens_after) == (90, 9)
    assert masked_by_index({"masked": [{"index": 4}]}) == {}
    assert masked_by_index({"masked": "4"}) == {}


def stored_item(i: int, role: str) -> StoredItem:
    return StoredItem(
        id=100 + i,
        session_id=1,
        parent_id=99 + i if i else None,
        path_hash=f"p{i}",
        content_hash=f"c{i}",
        role=role,
        token_count=10,
        message={"role": role, "content": f"m{i}"},
        status="complete",
        created_at=0.0,
    )
