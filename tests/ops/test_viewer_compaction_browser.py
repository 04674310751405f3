"""The viewer marks a compaction the proxy answered, in a real headless Chromium.

A Codex-style ``compaction_trigger`` goes through the proxy with the official
``openai`` client; the page shows the request with its badge and says, in the
request's detail, what was asked and what the proxy did, as the admin API does.
"""

from __future__ import annotations

from typing import Any

import openai

from proxy.http.sessions import tenant_of
from tests.ops.test_viewer_browser import Page, api, browser, wait_for

__all__ = ["browser"]  # the module's browser fixture, shared

SESSION = "codex-thread-1"
ROUTES = {
    "routes": [
        {
            "match": {"path": "/v1/responses"},
            "upstream": "default",
            "compaction": "proxy",
            "compaction_summarizer": {"model": "ctxproxy/extractive"},
        }
    ]
}


def test_a_compaction_shows_its_badge_and_what_the_proxy_did(browser: Any, admin_proxy: Any):
    proxy = admin_proxy(extra=ROUTES)
    client = openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key="sk-a",
        max_retries=0,
        default_headers={"X-Session-Id": SESSION},
    )
    turns = [
        {"role": "user", "content": "List the failing tests."},
        {"role": "assistant", "content": "test_parser and test_cli fail."},
        {"role": "user", "content": "Fix test_parser first."},
    ]
    answer = client.responses.create(model="gpt-4o", input=[*turns, {"type": "compaction_trigger"}])
    assert [o.type for o in answer.output] == ["compaction"]
    proxy.drain()
    view = api(proxy, f"sessions/{tenant_of('sk-a')}/{SESSION}")
    request = view["requests"][-1]
    assert request["compaction"]["status"] == "created"
    tab = Page(browser, proxy)
    try:
        p = tab.page
        tab.login()
        p.wait_for_selector("#sessions tbody a.sess")
        tab.open_session(SESSION)
        p.click(f"#timeline a[data-id='{request['id']}']")
        wait_for(p, f"document.getElementById('d-title').textContent.includes('{request['id']}')")
        assert "compaction created" in (p.text_content("#timeline") or "")
        detail = p.text_content("#detail") or ""
        assert f"trigger (proxy); created, {len(turns)} items folded" in detail
        assert tab.errors == []
    finally:
        tab.close()
