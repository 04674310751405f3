"""The viewer shows each of Codex's compactions, in a real headless Chromium.

Codex compacts twice through the proxy (as in test_codex_compaction.py); the
operator finds the thread's session in the viewer and reads, on each
compaction request, its badge and the "Compaction" line of its detail, the
same as the admin API gives.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.http.sessions import tenant_of
from tests.agents.codex import API_KEY, run_codex
from tests.agents.session import AUTO_COMPACT, FACTS, PROMPT, command
from tests.fakes.coding_task import CodingTask
from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config
from tests.ops.test_admin import ADMIN_KEY
from tests.ops.test_viewer_browser import Page, api, browser, wait_for

__all__ = ["browser"]  # the Chromium fixture, shared with the operator's browser tests


@pytest.fixture
def codex_session(
    loop_thread: LoopThread, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ProxyServer, str]]:
    """A proxy with the admin API after Codex compacted twice through it; the thread id."""
    monkeypatch.setenv("CTX_ADMIN_KEY", ADMIN_KEY)
    fake = CodingTask(commands=[command(f) for f in FACTS[:7]])
    upstream = AiohttpServer(loop_thread, fake.app())
    routes = [{"match": {"path": "/v1/responses"}, "upstream": "default"}]
    admin = {"admin": {"api_key": "os.environ/CTX_ADMIN_KEY"}}
    proxy = ProxyServer(
        loop_thread, make_config(upstream.url, tmp_path, routes=routes, extra=admin)
    )
    try:
        run = run_codex(tmp_path, proxy.url, PROMPT, auto_compact_tokens=AUTO_COMPACT)
        assert run.returncode == 0, run.stderr[-3000:]
        proxy.drain()
        yield proxy, fake.received[0].headers["session-id"]
    finally:
        proxy.stop()
        upstream.stop()


def test_the_viewer_shows_each_compaction_codex_asked_for(
    browser: Any, codex_session: tuple[ProxyServer, str]
) -> None:
    proxy, thread = codex_session
    view = api(proxy, f"sessions/{tenant_of(API_KEY)}/{thread}")
    asked = [q for q in view["requests"] if (q["compaction"] or {}).get("asked") == "trigger"]
    assert len(asked) == 2
    tab = Page(browser, proxy)
    try:
        tab.login()
        p = tab.page
        p.wait_for_selector("#sessions tbody a.sess")
        tab.open_session(thread)
        for q in asked:
            compaction = q["compaction"]
            badges = p.text_content(f"#timeline a[data-id='{q['id']}'] .badges") or ""
            assert f"compaction {compaction['status']}" in badges
            p.click(f"#timeline a[data-id='{q['id']}']")
            wait_for(p, f"document.getElementById('d-title').textContent.includes('{q['id']}')")
            line = p.text_content("#detail dl.facts-dl div:has(dt:text-is('Compaction')) dd")
            assert line is not None
            assert "trigger (proxy)" in line
            assert f"{compaction['status']}, {compaction['covered_items']} items folded" in line
        # A request after a compaction says it carried the item, expanded.
        later = [q for q in view["requests"] if (q["compaction"] or {}).get("expanded")]
        assert later
        last = later[-1]
        badges = p.text_content(f"#timeline a[data-id='{last['id']}'] .badges") or ""
        assert "compaction expanded" in badges
        p.click(f"#timeline a[data-id='{last['id']}']")
        wait_for(p, f"document.getElementById('d-title').textContent.includes('{last['id']}')")
        line = p.text_content("#detail dl.facts-dl div:has(dt:text-is('Compaction')) dd") or ""
        assert "1 item(s) expanded" in line
        restored = last["compaction"]["restored"]
        assert f"{restored} folded turns kept for recall" in line
        assert tab.errors == []
    finally:
        tab.close()
