"""The session viewer in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

The proxy runs under uvicorn on 127.0.0.1 with the fake upstream; conversations
go through it with the official ``openai`` client; the page is read the way an
operator reads it, and every number it shows is compared with the admin API's.
Screenshots go to ``docs/screenshots/`` when ``CTXPROXY_SCREENSHOTS=1`` (``make
screenshots``), to the test's temporary folder otherwise.

No browser is ever downloaded: ``make test`` apt-installs ``chromium`` when it is
missing (``.ci/ensure-chromium``); a machine without it fails these tests with
the command that installs it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import openai
import pytest

from proxy.http.sessions import tenant_of
from tests.fakes.upstream import Reply
from tests.ops.test_admin import ADMIN_KEY, AUTH

CHROMIUM = Path(os.environ.get("CTXPROXY_CHROMIUM", "/usr/bin/chromium"))
# Chromium as a sandboxed test browser: no network of its own, nothing phoned home.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "docs" / "screenshots"

ODD_KEY = '<b>odd</b> & "q"/x'
NONE = "\u2013"  # what the page shows for "not applicable"
PLANTED = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2">'

# Past four turns, the older ones are folded into a summary (offline, deterministic);
# tool results over 60 tokens are clipped.
SUPPORT = {
    "policies": {
        "support": {
            "strategy": "summarize",
            "trigger": {"turns": 4},
            "keep_last_turns": 2,
            "prefetch": False,
            "tool_output_max_tokens": 60,
            "summarizer": {"model": "ctxproxy/extractive"},
        },
        "last2": {"strategy": "trim", "max_turns": 2},
        # The same window, with recall of what it dropped.
        "last2recall": {"strategy": "trim", "max_turns": 2, "recall": {"max_tokens": 400}},
    },
    "routes": [
        {
            "match": {"path": "/v1/chat/completions", "headers": {"X-App": "recall"}},
            "upstream": "default",
            "policy": "last2recall",
        },
        {
            "match": {"path": "/v1/chat/completions", "headers": {"X-App": "trim"}},
            "upstream": "default",
            "policy": "last2",
        },
        {"match": {"path": "/v1/chat/completions"}, "upstream": "default", "policy": "support"},
    ],
}

LOOKUP = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup_order", "arguments": '{"order": "4410"}'},
}
TRACKING = "\n".join(
    f"2026-11-{d:02d} 08:{d:02d} parcel scanned at depot {d} (Lyon hub), status in transit"
    for d in range(1, 25)
)
# (user message, assistant reply) pairs; None: the assistant calls a tool first.
SCRIPT: list[tuple[str, str | None]] = [
    ("Hi, my order #4410 has not arrived. It was due on Monday.", None),
    (
        "Thanks. Can you send it to 12 Rue de Rivoli, Paris instead?",
        "I can change the address once it is back at the depot.",
    ),
    (PLANTED, "That looks like code; I will treat it as text."),
    (
        "Also, I was charged twice: EUR 89.90 on 2026-11-28.",
        "I see both charges; I have asked for a refund of EUR 89.90.",
    ),
    ("How long does the refund take?", "Refunds reach your card in 3 to 5 working days."),
    ("Which order number was this about again?", "Order #4410, going to 12 Rue de Rivoli, Paris."),
]


def _fail_without_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the browser tests need Debian's chromium. Install it with "
            "`apt-get update && apt-get install -y chromium` (`make test` runs "
            ".ci/ensure-chromium, which does that), or point CTXPROXY_CHROMIUM at a Chromium.",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    _fail_without_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the dev extra installs it
        pytest.fail("playwright is missing: pip install -e '.[dev]'", pytrace=False)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    if os.environ.get("CTXPROXY_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        return SHOTS
    return tmp_path


@pytest.fixture
def demo(admin_proxy, fake) -> Any:
    """A proxy with the admin API, a summarized support session and two others."""
    proxy = admin_proxy(extra=SUPPORT)
    upstream = fake[0]
    client = client_for(proxy, "support-4410")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a support agent for an online shop."}
    ]
    for question, answer in SCRIPT:
        messages.append({"role": "user", "content": question})
        if answer is None:
            upstream.replies.append(Reply(tool_calls=[LOOKUP]))
            reply = client.chat.completions.create(model="gpt-4o", messages=messages)
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": "call_1", "content": TRACKING})
            answer = "Your parcel is in transit at the Lyon hub; it should arrive on Thursday."
        upstream.replies.append(Reply(content=answer))
        reply = client.chat.completions.create(model="gpt-4o", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        proxy.drain()
    trim = client_for(proxy, "support-4410-trim", {"X-App": "trim"})
    history: list[dict[str, Any]] = []
    for question, _ in SCRIPT[1:5]:
        history.append({"role": "user", "content": question})
        reply = trim.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    recall = client_for(proxy, "support-4410-recall", {"X-App": "recall"})
    history = []
    for question, _ in SCRIPT[:6]:
        if question == PLANTED:
            continue
        history.append({"role": "user", "content": question})
        reply = recall.chat.completions.create(model="gpt-4o", messages=history)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    # A hostile session id: markup, an ampersand, quotes and a slash.
    client_for(proxy, ODD_KEY).chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "odd"}]
    )
    client_for(proxy, "billing-7", key="sk-other").chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "Where is my invoice?"}]
    )
    proxy.drain()
    proxy.messages = messages
    return proxy


def client_for(
    proxy: Any, session: str, headers: dict[str, str] | None = None, key: str = "sk-a"
) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{proxy.url}/v1",
        api_key=key,
        max_retries=0,
        default_headers={"X-Session-Id": session, **(headers or {})},
    )


def api(proxy: Any, path: str) -> Any:
    r = httpx.get(f"{proxy.url}/admin/{path}", headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()


def wait_for(p: Any, script: str, timeout: int = 5_000) -> None:
    """Poll ``script`` until it is truthy (Playwright's own wait_for_function evaluates a
    string with eval, which the page's Content-Security-Policy rightly refuses)."""
    deadline = time.monotonic() + timeout / 1000
    while not p.evaluate(script):
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout} ms: {script}")
        time.sleep(0.05)


def as_int(text: str) -> int:
    return int(text.replace(",", ""))


class Page:
    """A browser tab on the viewer that records everything the page logs."""

    def __init__(self, browser: Any, proxy: Any, width: int = 1280, height: int = 800) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.console: list[str] = []
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.console.append(m.text))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.proxy = proxy

    def login(self, key: str = ADMIN_KEY) -> None:
        p = self.page
        p.goto(f"{self.proxy.url}/admin/ui")
        p.wait_for_selector("#login:not([hidden])")
        p.fill("#key", key)
        p.press("#key", "Enter")

    def open_session(self, session: str) -> None:
        p = self.page
        p.fill("#q", session)
        p.press("#q", "Enter")
        wait_for(p, f"document.getElementById('list-note').textContent.includes({session!r})")
        listed = [a.text_content() for a in p.query_selector_all("#sessions tbody a.sess")]
        assert session in listed and all(session in key for key in listed)
        p.click(f"#sessions tbody a.sess:text-is('{session}')")
        p.wait_for_selector("#detail .entries")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any, demo: Any) -> Iterator[Page]:
    page = Page(browser, demo)
    yield page
    page.close()


def test_log_in_find_a_session_and_see_the_numbers_the_admin_api_gives(tab: Page, shots: Path):
    p = tab.page
    tab.login("wrong-key")
    wait_for(p, "document.getElementById('login-error').textContent.length > 0")
    assert p.text_content("#login-error") == "That key was refused."
    p.fill("#key", ADMIN_KEY)
    p.press("#key", "Enter")
    p.wait_for_selector("#sessions tbody a.sess")
    # The key is kept for this tab only.
    assert p.evaluate("sessionStorage.getItem('ctxproxy.adminKey')") == ADMIN_KEY
    assert p.evaluate("localStorage.length") == 0 and p.evaluate("document.cookie") == ""
    listed = [a.text_content() for a in p.query_selector_all("#sessions tbody a.sess")]
    assert listed == [s["key"] for s in api(tab.proxy, "sessions?limit=25")["data"]]
    p.screenshot(path=str(shots / "sessions.png"))

    tab.open_session("support-4410")
    assert p.text_content("#s-title") == "support-4410"
    view = api(tab.proxy, f"sessions/{tenant_of('sk-a')}/support-4410")
    stats = {
        dt.text_content(): dd.text_content()
        for dt, dd in zip(
            p.query_selector_all("#s-stats dt"), p.query_selector_all("#s-stats dd"), strict=True
        )
    }
    assert as_int(stats["Turns"]) == view["turns"] == len(SCRIPT)
    assert as_int(stats["Messages"]) == view["messages"]
    assert as_int(stats["Requests"]) == view["request_count"]
    assert as_int(stats["Stored tokens"]) == view["stored_tokens"]
    # Every request of the timeline, newest first, with the API's tokens before and after.
    rows = p.query_selector_all("#timeline > li")
    assert [r.get_attribute("data-id") for r in rows] == [
        q["id"] for q in reversed(view["requests"])
    ]
    for row, q in zip(rows, reversed(view["requests"]), strict=True):
        assert (
            as_int(row.query_selector("[data-field=before]").text_content())
            == q["tokens"]["before"]
        )
        assert (
            as_int(row.query_selector("[data-field=after]").text_content()) == q["tokens"]["after"]
        )
    # The newest request is open: its split, fate by fate, is the API's.
    newest = view["requests"][-1]
    assert p.get_attribute(f"#timeline a[data-id='{newest['id']}']", "aria-current") == "true"
    assert_split_shown(p, newest)
    assert (
        newest["summarized"]["status"] == "reused"
        and newest["tokens"]["split"]["sent"]["summarized"] > 0
    )
    summary_entry = p.query_selector("#detail li[data-fate=summary]")
    assert summary_entry is not None
    (summary,) = view["summaries"]
    assert summary["text"].splitlines()[0] in summary_entry.text_content()
    facts = [li.text_content() for li in summary_entry.query_selector_all(".facts li")]
    assert facts == [f"{f['kind']} {f['value']}" for f in summary["facts"]] and facts
    p.screenshot(path=str(shots / "session.png"))
    assert tab.errors == []


def assert_split_shown(p: Any, q: dict[str, Any]) -> None:
    split = q["tokens"]["split"]
    for row in p.query_selector_all("#detail .split-table tbody tr"):
        fate = row.get_attribute("data-fate")
        sent = row.query_selector("[data-col=sent]").text_content()
        forwarded = row.query_selector("[data-col=forwarded]").text_content()
        assert sent == NONE or as_int(sent) == split["sent"][fate], fate
        assert forwarded == NONE or as_int(forwarded) == split["forwarded"][fate], fate
    fates = {
        r.get_attribute("data-fate") for r in p.query_selector_all("#detail .split-table tbody tr")
    }
    assert {"kept", "clipped", "summarized", "recalled", "dropped"} <= fates
    assert (
        as_int(p.text_content("#detail .split-table tfoot [data-field=before]"))
        == q["tokens"]["before"]
    )
    assert (
        as_int(p.text_content("#detail .split-table tfoot [data-field=after]"))
        == q["tokens"]["after"]
    )


def test_clicking_a_request_shows_what_it_dropped_and_a_planted_script_as_text(
    tab: Page, shots: Path
):
    p = tab.page
    tab.login()
    p.wait_for_selector("#sessions tbody a.sess")
    tab.open_session("support-4410-trim")
    view = api(tab.proxy, f"sessions/{tenant_of('sk-a')}/support-4410-trim")
    # The third request (of four) dropped the first turn, the planted message among it.
    third = view["requests"][2]
    assert third["dropped"]["messages"] == 2
    p.click(f"#timeline a[data-id='{third['id']}']")
    wait_for(p, f"document.getElementById('d-title').textContent.includes('{third['id']}')")
    assert p.text_content("#d-title").startswith("Request #3")
    assert_split_shown(p, third)
    dropped = p.query_selector_all("#detail .entries li[data-fate=dropped]")
    assert [int(li.get_attribute("data-index")) for li in dropped] == third["dropped"]["indexes"]
    texts = [li.query_selector(".msg").text_content() for li in dropped]
    assert texts[0] == SCRIPT[1][0]
    kept = p.query_selector_all("#detail .entries li[data-fate=kept] .msg")
    # The planted message is the page's text, not markup: it ran nothing and added no element.
    planted = [li for li in kept if li.text_content() == PLANTED]
    assert len(planted) == 1
    assert p.evaluate("window.__pwned") is None
    assert p.evaluate("document.scripts.length") == 1
    assert p.query_selector("#detail img") is None
    assert p.evaluate("[...document.querySelectorAll('.msg')].every(e => e.children.length <= 2)")
    # The stored history beside it marks what this request left out.
    marks = [li.get_attribute("data-mark") for li in p.query_selector_all("#detail .hist")]
    assert marks == ["dropped", "dropped", "kept", "kept", "kept", "reply", "later", "later"]
    p.screenshot(path=str(shots / "request.png"), full_page=True)
    # A session id is text too, in the list, the title and the link that opens it.
    p.click(".crumbs a")
    p.wait_for_selector("#list:not([hidden])")
    tab.open_session(ODD_KEY)
    assert p.text_content("#s-title") == ODD_KEY and p.query_selector("#s-title b") is None
    assert api(tab.proxy, f"sessions?session={quote(ODD_KEY)}")["data"][0]["key"] == ODD_KEY
    # Nothing the conversation said reached the console.
    for line in tab.console:
        for question, answer in SCRIPT:
            assert question not in line and (answer or "") not in line
    assert tab.errors == []


def test_clicking_a_request_shows_the_turns_recall_brought_back_with_their_scores(tab: Page):
    p = tab.page
    tab.login()
    p.wait_for_selector("#sessions tbody a.sess")
    tab.open_session("support-4410-recall")
    view = api(tab.proxy, f"sessions/{tenant_of('sk-a')}/support-4410-recall")
    # The last question ("Which order number ...") brings back the dropped first turn.
    last = view["requests"][-1]
    assert last["recalled"] and last["recalled"]["units"], last["recalled"]
    p.click(f"#timeline a[data-id='{last['id']}']")
    wait_for(p, f"document.getElementById('d-title').textContent.includes('{last['id']}')")
    assert_split_shown(p, last)
    shown = [
        (int(li.get_attribute("data-start")), int(li.get_attribute("data-end")))
        for li in p.query_selector_all("#detail ul.recalled li")
    ]
    assert shown == [(u["start"], u["end"]) for u in last["recalled"]["units"]]
    scores = [li.text_content() for li in p.query_selector_all("#detail ul.recalled .score")]
    # A unit brought as context around a hit has no score of its own: the page shows a dash.
    units = last["recalled"]["units"]
    assert any(isinstance(u["score"], float) for u in units)
    assert scores == [NONE if u["score"] is None else f"{u['score']:.3f}" for u in units]
    # The forwarded list shows the recall block.
    block = p.query_selector("#detail .entries li[data-fate=recall]")
    assert block is not None and f"{last['recalled']['turns']} recalled turns" in (
        block.text_content() or ""
    )
    assert tab.errors == []


def test_the_page_is_keyboard_navigable(tab: Page):
    p = tab.page
    p.goto(f"{tab.proxy.url}/admin/ui")
    p.wait_for_selector("#login:not([hidden])")
    assert p.evaluate("document.activeElement.id") == "key"
    p.keyboard.type(ADMIN_KEY)
    p.keyboard.press("Enter")
    p.wait_for_selector("#sessions tbody a.sess")
    focus_by_tab(p, "#q")
    p.keyboard.type("trim")
    p.keyboard.press("Enter")
    wait_for(p, "document.querySelectorAll('#sessions tbody a.sess').length === 1")
    focus_by_tab(p, "#sessions tbody a.sess")
    p.keyboard.press("Enter")
    p.wait_for_selector("#detail .entries")
    view = api(tab.proxy, f"sessions/{tenant_of('sk-a')}/support-4410-trim")
    ids = [q["id"] for q in reversed(view["requests"])]
    focus_by_tab(p, "#timeline a.req")
    assert p.evaluate("document.activeElement.dataset.id") == ids[0]
    for expected in ids[1:]:
        p.keyboard.press("ArrowDown")
        wait_for(p, f"document.getElementById('d-title').textContent.includes('{expected}')")
        assert p.evaluate("document.activeElement.dataset.id") == expected
        assert p.get_attribute(f"#timeline a[data-id='{expected}']", "aria-current") == "true"
    p.keyboard.press("Home")
    wait_for(p, f"document.getElementById('d-title').textContent.includes('{ids[0]}')")
    # The focused element is always visibly outlined.
    outline = p.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none"


def focus_by_tab(p: Any, selector: str, limit: int = 60) -> None:
    for _ in range(limit):
        p.keyboard.press("Tab")
        if p.evaluate(f"document.activeElement.matches({selector!r})"):
            return
    raise AssertionError(f"Tab never reached {selector}")


def test_a_live_session_updates_without_a_reload(tab: Page):
    p = tab.page
    tab.login()
    p.wait_for_selector("#sessions tbody a.sess")
    tab.open_session("support-4410")
    p.evaluate("window.__sameDocument = true")
    before = len(p.query_selector_all("#timeline > li"))
    messages = [
        *tab.proxy.messages,
        {"role": "user", "content": "One more thing: can I get an invoice?"},
    ]
    client_for(tab.proxy, "support-4410").chat.completions.create(model="gpt-4o", messages=messages)
    tab.proxy.drain()
    wait_for(
        p, f"document.querySelectorAll('#timeline > li').length === {before + 1}", timeout=10_000
    )
    assert p.evaluate("window.__sameDocument") is True
    view = api(tab.proxy, f"sessions/{tenant_of('sk-a')}/support-4410")
    top = p.query_selector("#timeline > li")
    assert top.get_attribute("data-id") == view["requests"][-1]["id"]
    assert (
        as_int(top.query_selector("[data-field=before]").text_content())
        == view["requests"][-1]["tokens"]["before"]
    )
    assert as_int(p.text_content("[data-stat=Requests]")) == view["request_count"]


def test_a_phone_sized_viewport_stacks_the_page_without_sideways_scrolling(
    browser: Any, demo: Any, shots: Path
):
    tab = Page(browser, demo, width=390, height=844)
    try:
        p = tab.page
        tab.login()
        p.wait_for_selector("#sessions tbody a.sess")
        assert p.evaluate("document.documentElement.scrollWidth") <= 390
        p.screenshot(path=str(shots / "phone-sessions.png"))
        tab.open_session("support-4410")
        assert p.evaluate("document.documentElement.scrollWidth") <= 390
        timeline = p.query_selector(".timeline").bounding_box()
        detail = p.query_selector("#detail").bounding_box()
        assert detail["y"] >= timeline["y"] + timeline["height"]
        assert timeline["width"] <= 390 and detail["width"] <= 390
        # Text stays readable: nothing smaller than 11px.
        smallest = p.evaluate(
            "Math.min(...[...document.querySelectorAll('body *')].filter(e => e.offsetParent && e.textContent.trim()).map(e => parseFloat(getComputedStyle(e).fontSize)))"
        )
        assert smallest >= 11
        p.screenshot(path=str(shots / "phone-session.png"))
        assert tab.errors == []
    finally:
        tab.close()


def test_the_key_is_asked_again_in_a_new_tab_and_when_refused(browser: Any, demo: Any):
    first = Page(browser, demo)
    second = Page(browser, demo)
    try:
        first.login()
        first.page.wait_for_selector("#sessions tbody a.sess")
        second.page.goto(f"{demo.url}/admin/ui")
        second.page.wait_for_selector("#login:not([hidden])")
        # A key that stops working (rotated) sends the tab back to the login form.
        first.page.evaluate("sessionStorage.setItem('ctxproxy.adminKey', 'rotated')")
        first.page.reload()
        first.page.wait_for_selector("#login:not([hidden])")
        assert re.search("refused", first.page.text_content("#login-error"))
        assert first.page.evaluate("sessionStorage.getItem('ctxproxy.adminKey')") is None
        first.page.fill("#key", ADMIN_KEY)
        first.page.press("#key", "Enter")
        first.page.wait_for_selector("#sessions tbody a.sess")
        first.page.click("#logout")
        first.page.wait_for_selector("#login:not([hidden])")
        assert first.page.evaluate("sessionStorage.length") == 0
    finally:
        first.close()
        second.close()
