"""The viewer's page and the admin API it reads, over real HTTP: files, headers, the
``?session=`` filter, each request's token split and its context item by item."""

from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from proxy.http.sessions import tenant_of
from proxy.ops.timeline import masked_by_index, recalled_entries
from proxy.ops.viewer import ASSETS, CSP, page_bytes
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
    assert view["requests"][-1]["recalled"] == [] and view["requests"][-1]["masked"] == []


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


def test_recalled_and_masked_details_are_read_in_either_shape():
    assert recalled_entries({"recalled": [3, {"index": 5, "score": 0.81, "tokens": 12}]}) == [
        {"index": 3, "score": None, "tokens": None},
        {"index": 5, "score": 0.81, "tokens": 12},
    ]
    nested = {"recall": {"recalled": [{"position": 2, "score": 1}, "junk", True]}}
    assert recalled_entries(nested) == [{"index": 2, "score": 1, "tokens": None}]
    assert recalled_entries({"recalled": "3"}) == []
    masked = masked_by_index({"masked": [{"index": 4, "tokens_before": 90, "tokens_after": 9}]})
    assert (masked[4].tokens_before, masked[4].tokens_after) == (90, 9)
    assert masked_by_index({"masked": [{"index": 4}]}) == {}
