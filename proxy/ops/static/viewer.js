// ctxproxy session viewer: reads the admin API with the key kept in this tab's sessionStorage.
// Every value reaches the page through textContent or setAttribute (never innerHTML): message
// text is untrusted. Nothing is logged (no console calls).
"use strict";
(() => {
  const KEY_STORE = "ctxproxy.adminKey";
  const POLL_MS = 3000;
  const PAGE = 25;
  const CLAMP = 600; // characters of a message shown before "Show all"
  const FATES = {
    kept: "sent verbatim",
    clipped: "tool result shortened to fit (head and tail kept)",
    masked: "old tool output replaced by a placeholder",
    summarized: "folded into the summary",
    summary: "the summary forwarded in their place",
    recalled: "evicted turn brought back for the newest message",
    dropped: "left out (trimmed)",
    other: "tool definitions, reply priming and framing",
  };
  const SENT = ["kept", "clipped", "masked", "summarized", "recalled", "dropped", "other"];
  const FORWARDED = ["kept", "clipped", "masked", "summary", "recalled", "other"];

  const $ = (id) => document.getElementById(id);
  const state = {
    key: sessionStorage.getItem(KEY_STORE),
    paused: false,
    timer: 0,
    gen: 0,
    route: null,
    session: null, // the session detail last shown
    sessionSig: "",
    listSig: "",
    rows: new Map(), // request id -> timeline <li>
    selected: null,
    contexts: new Map(), // request id -> its context (request rows never change)
  };

  class AuthError extends Error {}

  // -- DOM -------------------------------------------------------------------

  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = String(v);
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(3)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : String(c));
    }
    return el;
  }

  // Replace an element's children (null and false children are left out, as in h).
  function fill(el, ...children) {
    el.replaceChildren(...children.flat(3).filter((c) => c !== null && c !== undefined && c !== false));
  }

  const enc = encodeURIComponent;
  const num = (n) => (typeof n === "number" ? n.toLocaleString("en-US") : "–");
  const ms = (n) => (typeof n === "number" ? `${n < 10 ? n.toFixed(1) : Math.round(n)} ms` : "–");
  const utc = (iso) => (iso ? String(iso).slice(0, 19).replace("T", " ") : "–");
  const clock = (iso) => (iso ? String(iso).slice(11, 19) : "–");

  function show(id) {
    for (const s of ["login", "list", "session"]) $(s).hidden = s !== id;
    const signedIn = id !== "login";
    $("logout").hidden = !signedIn;
    $("pause").hidden = !signedIn;
  }

  function notice(text) {
    $("error").hidden = !text;
    $("error").textContent = text || "";
  }

  function live(text) {
    $("live").textContent = text;
  }

  // -- the admin API ---------------------------------------------------------

  async function api(path) {
    let r;
    try {
      // Relative to /admin/ui: "sessions" is /admin/sessions, behind any path prefix.
      r = await fetch(path, {
        headers: { Authorization: `Bearer ${state.key}`, Accept: "application/json" },
        cache: "no-store",
        credentials: "omit",
      });
    } catch {
      throw new Error("The proxy did not answer.");
    }
    if (r.status === 401) throw new AuthError("The admin key was refused.");
    if (!r.ok) {
      let message = `HTTP ${r.status}`;
      try {
        const body = await r.json();
        if (body && body.error && typeof body.error.message === "string") message = body.error.message;
      } catch {
        /* not JSON: the status says enough */
      }
      const error = new Error(message);
      error.status = r.status;
      throw error;
    }
    return r.json();
  }

  // -- routing (#/?q=..&o=.. | #/s/TENANT/KEY[/r/REQUEST]) ------------------------

  function parseRoute() {
    const [path, query] = (location.hash.replace(/^#/, "") || "/").split("?");
    let parts;
    try {
      parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    } catch {
      parts = [];
    }
    if (parts[0] === "s" && parts.length >= 3) {
      return { view: "session", tenant: parts[1], key: parts[2], request: parts[3] === "r" ? parts[4] || null : null };
    }
    const params = new URLSearchParams(query || "");
    return { view: "list", q: params.get("q") || "", offset: Math.max(0, parseInt(params.get("o") || "0", 10) || 0) };
  }

  const sessionHref = (tenant, key, request) =>
    `#/s/${enc(tenant)}/${enc(key)}${request ? `/r/${enc(request)}` : ""}`;
  const listHref = (q, offset) => {
    const params = new URLSearchParams();
    if (q) params.set("q", q);
    if (offset) params.set("o", String(offset));
    const s = params.toString();
    return s ? `#/?${s}` : "#/";
  };

  async function route() {
    const r = parseRoute();
    const prev = state.route;
    state.route = r;
    if (!state.key) {
      show("login");
      $("key").focus();
      return;
    }
    const sameSession = prev && prev.view === "session" && r.view === "session" &&
      prev.tenant === r.tenant && prev.key === r.key && state.session;
    if (sameSession) {
      select(r.request || newestId(), false);
      return;
    }
    state.gen += 1;
    state.session = null;
    state.sessionSig = "";
    state.listSig = "";
    state.rows.clear();
    state.selected = null;
    await refresh(false);
  }

  async function refresh(polling) {
    const gen = state.gen;
    const r = state.route;
    clearTimeout(state.timer);
    try {
      if (r.view === "session") await loadSession(r, gen, polling);
      else await loadList(r, gen);
      if (gen !== state.gen) return;
      notice("");
      live(state.paused ? "Paused" : `Live · ${new Date().toISOString().slice(11, 19)}`);
    } catch (error) {
      if (gen !== state.gen) return;
      if (error instanceof AuthError) {
        signOut("The admin key was refused (it may have changed): enter it again.");
        return;
      }
      notice(polling ? `Updates failed: ${error.message} Retrying.` : error.message);
      live("Offline");
    }
    schedule();
  }

  function schedule() {
    clearTimeout(state.timer);
    if (!state.paused && state.key) state.timer = setTimeout(() => {
      if (!document.hidden) refresh(true);
      else schedule();
    }, POLL_MS);
  }

  function signOut(message) {
    sessionStorage.removeItem(KEY_STORE);
    state.key = null;
    state.gen += 1;
    clearTimeout(state.timer);
    state.contexts.clear();
    live("");
    notice("");
    $("login-error").textContent = message || "";
    show("login");
    $("key").focus();
  }

  async function login(event) {
    event.preventDefault();
    const key = $("key").value.trim();
    if (!key) return;
    state.key = key;
    try {
      await api("sessions?limit=1");
    } catch (error) {
      state.key = null;
      $("login-error").textContent = error instanceof AuthError ? "That key was refused." : error.message;
      return;
    }
    sessionStorage.setItem(KEY_STORE, key);
    $("key").value = "";
    $("login-error").textContent = "";
    state.route = null;
    await route();
    $("main").focus();
  }

  // -- sessions list ---------------------------------------------------------

  async function loadList(r, gen) {
    const params = new URLSearchParams({ limit: String(PAGE), offset: String(r.offset) });
    if (r.q) params.set("session", r.q);
    const page = await api(`sessions?${params}`);
    if (gen !== state.gen) return;
    show("list");
    if (document.activeElement !== $("q")) $("q").value = r.q;
    const sig = JSON.stringify(page);
    if (sig === state.listSig) return;
    state.listSig = sig;
    const rows = page.data.map((s) =>
      h("tr", {},
        h("th", { scope: "row" }, h("a", { href: sessionHref(s.tenant, s.key), class: "sess", text: s.key })),
        h("td", { class: "wide mono", title: s.tenant, text: s.tenant.slice(0, 12) }),
        h("td", { class: "num", text: num(s.turns) }),
        h("td", { class: "num wide", text: num(s.messages) }),
        h("td", { class: "num", text: num(s.request_count) }),
        h("td", { class: "num", text: num(s.stored_tokens) }),
        h("td", { title: s.last_activity, text: utc(s.last_activity) })));
    if (!rows.length) {
      const what = r.q ? `No session id contains “${r.q}”.` : "No sessions stored yet.";
      rows.push(h("tr", {}, h("td", { colspan: 7, class: "empty", text: what })));
    }
    $("sessions").tBodies[0].replaceChildren(...rows);
    $("list-note").textContent = r.q ? `Sessions whose id contains “${r.q}”, in any tenant.` : "Most recent activity first.";
    $("prev").disabled = r.offset === 0;
    $("next").disabled = !page.has_more;
    const first = page.data.length ? r.offset + 1 : r.offset;
    $("page-info").textContent = `${first}–${r.offset + page.data.length}${page.has_more ? "" : " (end)"}`;
  }

  // -- one session -------------------------------------------------------------

  async function loadSession(r, gen, polling) {
    const s = await api(`sessions/${enc(r.tenant)}/${enc(r.key)}`);
    if (gen !== state.gen) return;
    show("session");
    const sig = `${s.request_count}|${s.last_activity}|${s.messages}|${s.summaries.length}`;
    if (sig === state.sessionSig) return;
    const first = !state.session;
    state.sessionSig = sig;
    state.session = s;
    renderSessionHead(s);
    renderTimeline(s);
    renderSummaries(s);
    const wanted = first ? r.request || newestId() : state.selected;
    select(wanted, polling);
  }

  function newestId() {
    const reqs = state.session ? state.session.requests : [];
    return reqs.length ? reqs[reqs.length - 1].id : null;
  }

  function renderSessionHead(s) {
    $("s-title").textContent = s.key;
    $("s-crumb").textContent = s.key;
    document.title = `ctxproxy · ${s.key}`;
    const cal = (s.calibration || []).map((c) => `${c.model} ×${c.factor}`).join(", ");
    const stats = [
      ["Tenant", s.tenant, "mono"],
      ["Turns", num(s.turns)],
      ["Messages", num(s.messages)],
      ["Requests", num(s.request_count)],
      ["Stored tokens", num(s.stored_tokens)],
      ["Created (UTC)", utc(s.created_at)],
      ["Last activity (UTC)", utc(s.last_activity)],
      ["Calibration", cal || "–"],
    ];
    $("s-stats").replaceChildren(...stats.map(([k, v, cls]) =>
      h("div", {}, h("dt", { text: k }), h("dd", { class: cls, "data-stat": k, text: v }))));
    $("legend").replaceChildren(...["kept", "clipped", "masked", "summarized", "summary", "recalled", "dropped", "other"].map((f) =>
      h("span", { class: "chip", title: FATES[f] }, h("i", { class: `sw f-${f}`, "aria-hidden": "true" }), f)));
  }

  function bar(parts, total, scale, label) {
    const el = h("div", { class: "bar", role: "img" });
    const words = [];
    for (const [fate, n] of parts) {
      if (!n || n <= 0) continue;
      words.push(`${fate} ${num(n)}`);
      const seg = h("i", { class: `seg f-${fate}` });
      // CSSOM, not a style attribute: the page's CSP allows no inline styles.
      seg.style.width = `${(100 * n) / (scale || 1)}%`;
      el.append(seg);
    }
    el.setAttribute("aria-label", `${label}: ${num(total)} tokens (${words.join(", ") || "none"})`);
    el.title = `${label}: ${words.join(", ")}`;
    return el;
  }

  const sentParts = (t) => SENT.map((f) => [f, t.split.sent[f]]);
  const fwdParts = (t) => FORWARDED.map((f) => [f, t.split.forwarded[f]]);

  function badges(q) {
    const out = [];
    if (q.status !== 200) out.push(h("span", { class: "badge bad", text: q.error ? `${q.status} error` : String(q.status) }));
    if (q.incomplete) out.push(h("span", { class: "badge warn", text: "incomplete" }));
    if (q.summarized && q.summarized.status && q.summarized.status !== "none") {
      out.push(h("span", { class: "badge f-summarized-b", text: `summary ${q.summarized.status}` }));
    }
    if (q.fallback) out.push(h("span", { class: "badge warn", text: `fallback: ${q.fallback}` }));
    const c = q.compaction;
    if (c && c.status) out.push(h("span", { class: `badge ${c.fallback ? "warn" : "f-summarized-b"}`, text: `compaction ${c.status}` }));
    else if (c && c.expanded) out.push(h("span", { class: "badge f-summary-b", text: "compaction expanded" }));
    if (q.recalled && q.recalled.turns) out.push(h("span", { class: "badge f-recalled-b", text: `${q.recalled.turns} recalled` }));
    if (q.recalled && q.recalled.status === "error") out.push(h("span", { class: "badge warn", text: "recall error" }));
    if (q.masked && q.masked.length) out.push(h("span", { class: "badge f-masked-b", text: `${q.masked.length} masked` }));
    if (q.dropped.reason) out.push(h("span", { class: "badge", text: q.dropped.reason }));
    return out;
  }

  function renderTimeline(s) {
    const ol = $("timeline");
    const reqs = s.requests;
    const scale = Math.max(1, ...reqs.map((q) => q.tokens.before));
    const fresh = [];
    reqs.forEach((q, i) => {
      if (state.rows.has(q.id)) return;
      const saved = q.tokens.before ? Math.round((100 * q.tokens.saved) / q.tokens.before) : 0;
      const link = h("a", { class: "req", href: sessionHref(s.tenant, s.key, q.id), "data-id": q.id },
        h("span", { class: "req-head" },
          h("b", { class: "n", text: `#${i + 1}` }),
          h("span", { class: "muted clock", title: q.created_at, text: clock(q.created_at) }),
          h("span", { class: "pol", text: q.mode ? `${q.policy} · ${q.mode}` : q.policy || "–" }),
          h("span", { class: "grow" }),
          h("span", { class: "tok" },
            h("span", { "data-field": "before", text: num(q.tokens.before) }), " → ",
            h("span", { "data-field": "after", text: num(q.tokens.after) }),
            h("span", { class: "muted", text: saved > 0 ? ` −${saved}%` : "" })),
          h("span", { class: "muted lat", text: ms(q.latency_ms.total) })),
        h("span", { class: "bars" },
          bar(sentParts(q.tokens), q.tokens.before, scale, "as sent"),
          bar(fwdParts(q.tokens), q.tokens.after, scale, "as forwarded")),
        h("span", { class: "badges" }, badges(q)));
      const li = h("li", { "data-id": q.id, "data-before": q.tokens.before }, link);
      state.rows.set(q.id, li);
      fresh.push(li);
    });
    // Newest first: new rows go on top; rows already shown stay (and keep focus).
    ol.prepend(...fresh.reverse());
    // A larger request rescales every bar.
    const byId = new Map(reqs.map((q) => [q.id, q]));
    for (const li of ol.children) {
      const q = byId.get(li.dataset.id);
      if (!q) continue;
      const bars = li.querySelectorAll(".bar");
      bars[0].replaceWith(bar(sentParts(q.tokens), q.tokens.before, scale, "as sent"));
      bars[1].replaceWith(bar(fwdParts(q.tokens), q.tokens.after, scale, "as forwarded"));
    }
    if (!reqs.length) ol.replaceChildren(h("li", { class: "muted", text: "No requests recorded." }));
  }

  function select(id, polling) {
    if (!id || !state.session) {
      state.selected = null;
      return;
    }
    const changed = state.selected !== id;
    state.selected = id;
    for (const a of $("timeline").querySelectorAll("a.req")) {
      if (a.dataset.id === id) a.setAttribute("aria-current", "true");
      else a.removeAttribute("aria-current");
    }
    if (!changed && polling) {
      // Same request: its row is unchanged, only the stored history may have grown.
      const ctx = state.contexts.get(id);
      if (ctx) renderDetail(ctx);
      return;
    }
    loadDetail(id);
  }

  async function loadDetail(id) {
    const gen = state.gen;
    let ctx = state.contexts.get(id);
    if (!ctx) {
      try {
        ctx = await api(`requests/${enc(id)}/context`);
      } catch (error) {
        if (error instanceof AuthError) signOut("The admin key was refused: enter it again.");
        else notice(error.message);
        return;
      }
      state.contexts.set(id, ctx);
    }
    if (gen === state.gen && state.selected === id) renderDetail(ctx);
  }

  function clampText(text, cls) {
    const el = h("div", { class: cls || "msg" });
    if (text.length <= CLAMP) {
      el.textContent = text;
      return el;
    }
    const body = h("span", { text: `${text.slice(0, CLAMP)}…` });
    const more = h("button", { type: "button", class: "link", "aria-expanded": "false", text: `Show all (${num(text.length)} characters)` });
    more.addEventListener("click", () => {
      const open = more.getAttribute("aria-expanded") === "true";
      body.textContent = open ? `${text.slice(0, CLAMP)}…` : text;
      more.setAttribute("aria-expanded", String(!open));
      more.textContent = open ? `Show all (${num(text.length)} characters)` : "Show less";
    });
    el.append(body, " ", more);
    return el;
  }

  function msgText(m) {
    if (m === null || m === undefined) return "";
    if (typeof m !== "object") return String(m);
    const parts = [];
    const c = m.content;
    if (typeof c === "string") parts.push(c);
    else if (Array.isArray(c)) {
      for (const p of c) {
        if (typeof p === "string") parts.push(p);
        else if (p && typeof p.text === "string") parts.push(p.text);
        else if (p && p.type) parts.push(`[${p.type}]`);
      }
    }
    if (typeof m.refusal === "string" && m.refusal) parts.push(`[refusal] ${m.refusal}`);
    for (const t of Array.isArray(m.tool_calls) ? m.tool_calls : []) {
      const f = (t && t.function) || {};
      parts.push(`→ ${f.name || "?"}(${typeof f.arguments === "string" ? f.arguments : JSON.stringify(f.arguments || "")})`);
    }
    if (m.type === "function_call") parts.push(`→ ${m.name || "?"}(${m.arguments || ""})`);
    if (m.type === "function_call_output") parts.push(typeof m.output === "string" ? m.output : JSON.stringify(m.output));
    if (m.type === "reasoning" && Array.isArray(m.summary)) parts.push(...m.summary.map((p) => (p && p.text) || ""));
    return parts.length ? parts.join("\n") : JSON.stringify(m);
  }

  const roleOf = (m) => (m && (m.role || m.type)) || "?";

  function facts(list) {
    if (!list || !list.length) return h("p", { class: "muted", text: "No pinned facts." });
    return h("ul", { class: "facts" }, list.map((f) =>
      h("li", {}, h("span", { class: "kind", text: f.kind || "fact" }), " ", f.value === undefined ? JSON.stringify(f) : String(f.value))));
  }

  function flagged(list) {
    if (!list || !list.length) return h("p", { class: "muted", text: "No flagged entities." });
    return h("ul", { class: "flagged" }, list.map((e) =>
      h("li", { title: "stated by the summary, never mentioned by its source", text: String(e) })));
  }

  function summaryBlock(sm) {
    return h("div", { class: "summary-body" },
      sm.text ? clampText(sm.text, "msg summary-text") : h("p", { class: "muted", text: "Summary text not stored." }),
      h("h4", { text: "Pinned facts" }), facts(sm.facts),
      h("h4", { text: "Flagged entities" }), flagged(sm.flagged));
  }

  function splitTable(t) {
    const sp = t.split;
    const rows = [
      ["kept", sp.sent.kept, sp.forwarded.kept],
      ["clipped", sp.sent.clipped, sp.forwarded.clipped],
      ["masked", sp.sent.masked, sp.forwarded.masked],
      ["summarized", sp.sent.summarized, null],
      ["summary", null, sp.forwarded.summary],
      ["recalled", sp.sent.recalled, sp.forwarded.recalled],
      ["dropped", sp.sent.dropped, null],
      ["other", sp.sent.other, sp.forwarded.other],
    ].filter(([f, a, b]) => ["kept", "clipped", "summarized", "recalled", "dropped"].includes(f) || a || b);
    return h("table", { class: "split-table" },
      h("caption", { text: "Tokens by fate" }),
      h("thead", {}, h("tr", {}, h("th", { scope: "col", text: "" }), h("th", { scope: "col", class: "num", text: "as sent" }), h("th", { scope: "col", class: "num", text: "as forwarded" }))),
      h("tbody", {}, rows.map(([f, a, b]) =>
        h("tr", { "data-fate": f },
          h("th", { scope: "row", title: FATES[f] }, h("i", { class: `sw f-${f}`, "aria-hidden": "true" }), f),
          h("td", { class: "num", "data-col": "sent", text: a === null ? "–" : num(a) }),
          h("td", { class: "num", "data-col": "forwarded", text: b === null ? "–" : num(b) })))),
      h("tfoot", {}, h("tr", {}, h("th", { scope: "row", text: "total" }),
        h("td", { class: "num", "data-field": "before", text: num(t.before) }),
        h("td", { class: "num", "data-field": "after", text: num(t.after) }))));
  }

  // What the proxy did at a compaction (the request row's detail.compaction).
  function compactionText(c) {
    if (!c) return "–";
    const parts = [];
    if (c.asked) parts.push(`${c.asked} (${c.mode || "?"})`);
    if (c.status) parts.push(`${c.status}${c.fallback ? `: ${c.fallback}` : ""}, ${num(c.covered_items)} items folded${c.incremental ? ", incremental" : ""}`);
    if (c.expanded) parts.push(`${c.expanded} item(s) expanded`);
    if (c.restored) parts.push(`${c.restored} folded turns kept for recall`);
    if (c.foreign_dropped) parts.push(`${c.foreign_dropped} foreign item(s) taken out`);
    return parts.join("; ") || "–";
  }

  function renderDetail(ctx) {
    const s = state.session;
    const q = ctx.request;
    const index = s.requests.findIndex((x) => x.id === q.id);
    const t = q.tokens;
    const scale = Math.max(1, t.before, t.after);
    const sm = q.summarized;
    const facts_ = [
      ["Time (UTC)", utc(q.created_at)],
      ["Status", `${q.status}${q.upstream_status !== null && q.upstream_status !== q.status ? ` (upstream ${q.upstream_status})` : ""}${q.incomplete ? ", incomplete" : ""}`],
      ["Model", q.model || "–"],
      ["Route", q.route || "–"],
      ["Policy", q.policy || "–"],
      ["Mode", q.mode || "–"],
      ["Summary", sm ? `${sm.status}${typeof sm.wait_ms === "number" ? `, waited ${ms(sm.wait_ms)}` : ""}` : "–"],
      ["Fallback", q.fallback || "–"],
      ["Compaction", compactionText(q.compaction)],
      ["Dropped", q.dropped.messages ? `${q.dropped.messages} messages, ${q.dropped.turns} turns (${q.dropped.reason || "–"})` : "nothing"],
      ["Latency", `${ms(q.latency_ms.total)} total, ${ms(q.latency_ms.upstream)} upstream`],
      ["Messages", `${num(q.messages.before)} → ${num(q.messages.after)}`],
      ["Budget", t.budget ? `${num(t.budget)} tokens${t.calibration !== 1 ? ` (calibration ×${t.calibration})` : ""}` : "none"],
      ["Stream", q.stream ? "yes" : "no"],
    ];
    if (q.error) facts_.push(["Error", q.error]);
    if (q.usage && typeof q.usage.prompt_tokens === "number") {
      facts_.push(["Upstream usage", `${num(q.usage.prompt_tokens)} prompt, ${num(q.usage.completion_tokens)} completion`]);
    }
    const cache = q.cache;
    if (cache && typeof cache.prompt_tokens === "number") {
      const ratio = typeof cache.hit_ratio === "number" ? ` (${Math.round(cache.hit_ratio * 100)}%)` : "";
      facts_.push(["Prompt cache", `${num(cache.cached_tokens || 0)} of ${num(cache.prompt_tokens)} cached${ratio}`]);
    }
    const entries = ctx.entries.map((e) => entryItem(e));
    const fateOf = new Map();
    for (const e of ctx.entries) if (e.kind === "message" && e.item_id !== null) fateOf.set(e.item_id, e);
    const replyId = q.items.reply;
    const lastPos = q.items.last === null ? -1 : s.history.findIndex((it) => it.id === q.items.last);
    const history = s.history.map((it, pos) => {
      const e = fateOf.get(it.id);
      const mark = e ? e.fate : it.id === replyId ? "reply" : lastPos >= 0 && pos > lastPos ? "later" : "stored";
      return h("li", { class: `hist m-${mark}`, "data-item": it.id, "data-mark": mark },
        h("div", { class: "ent-head" },
          h("span", { class: `badge f-${mark}-b`, text: mark === "later" ? "after this request" : mark === "reply" ? "reply" : mark }),
          h("b", { text: `#${pos}` }),
          h("span", { class: "role", text: it.role }),
          h("span", { class: "muted", text: `item ${it.id}` }),
          h("span", { class: "grow" }),
          h("span", { class: "muted", text: `${num(it.token_count)} tok` })),
        clampText(msgText(it.message)),
        it.first_dropped_by ? h("p", { class: "muted small", text: `first dropped by ${reqLabel(it.first_dropped_by)}` }) : null,
        it.first_summarized_by ? h("p", { class: "muted small", text: `first summarized by ${reqLabel(it.first_summarized_by)}` }) : null);
    });
    const rc = q.recalled;
    let recalled;
    if (!rc) recalled = h("p", { class: "muted", text: "Recall is not enabled for this request's policy." });
    else if (!rc.units.length) {
      recalled = h("p", { class: "muted", text: `No turns recalled (${rc.status || "none"}${rc.error ? `: ${rc.error}` : ""}).` });
    } else {
      recalled = h("div", {},
        h("p", { class: "muted small", text: `${rc.turns} turns (${rc.messages} messages) in ${num(rc.tokens)} tokens${rc.budget ? ` of a ${num(rc.budget)}-token budget` : ""}, quoted before the newest user turn.` }),
        h("ul", { class: "recalled" }, rc.units.map((u) =>
          h("li", { "data-start": u.start, "data-end": u.end },
            u.end - u.start > 1 ? `messages #${u.start}–#${u.end - 1}` : `message #${u.start}`,
            " · score ", h("b", { class: "score", text: typeof u.score === "number" ? u.score.toFixed(3) : "–" }),
            u.hits.length ? h("span", { class: "muted", text: ` (matched ${u.hits.map((x) => `#${x.index}`).join(", ")})` }) : null))));
    }
    fill($("detail"),
      h("h2", { id: "d-title" }, `Request #${index + 1} `, h("code", { class: "small", text: q.id })),
      h("dl", { class: "facts-dl" }, facts_.map(([k, v]) => h("div", {}, h("dt", { text: k }), h("dd", { text: v })))),
      h("div", { class: "big-bars" },
        h("span", { class: "bl", text: `sent ${num(t.before)}` }), bar(sentParts(t), t.before, scale, "as sent"),
        h("span", { class: "bl", text: `forwarded ${num(t.after)}` }), bar(fwdParts(t), t.after, scale, "as forwarded")),
      splitTable(t),
      t.split.exact ? null : h("p", { class: "muted small", text: "Some messages' tokens are unknown (not on the current branch): they count as other." }),
      h("h3", { text: "Recalled turns" }), recalled,
      h("div", { class: "cols" },
        h("section", { "aria-labelledby": "fw-title" },
          h("h3", { id: "fw-title", text: "Forwarded, item by item" }),
          ctx.chain === "current_branch" ? null : h("p", { class: "muted small", text: "This request's messages are not on the session's current branch (or were not stored): positions only." }),
          h("ol", { class: "entries" }, entries)),
        h("section", { "aria-labelledby": "st-title" },
          h("h3", { id: "st-title", text: "Stored history (current branch)" }),
          h("ol", { class: "entries" }, history))));
  }

  function reqLabel(id) {
    const i = state.session ? state.session.requests.findIndex((x) => x.id === id) : -1;
    return i < 0 ? id : `#${i + 1}`;
  }

  function entryItem(e) {
    if (e.kind === "recall") {
      return h("li", { class: "ent m-recalled", "data-fate": "recall" },
        h("div", { class: "ent-head" },
          h("span", { class: "badge f-recalled-b", text: "recall block" }),
          h("b", { text: `${e.turns} recalled turns` }),
          h("span", { class: "muted", text: `quoting #${e.indexes.join(", #")}` }),
          h("span", { class: "grow" }),
          h("span", { class: "muted", text: `${num(e.tokens)} tok` })));
    }
    if (e.kind === "summary") {
      return h("li", { class: "ent f-summary-e", "data-fate": "summary" },
        h("div", { class: "ent-head" },
          h("span", { class: "badge f-summary-b", text: "summary" }),
          h("b", { text: `summary #${e.summary_id}` }),
          h("span", { class: "muted", text: `stands in for ${e.stands_in_for} messages (${e.turns} turns), placed as ${e.placement}` }),
          h("span", { class: "grow" }),
          h("span", { class: "muted", text: `${num(e.tokens)} tok` })),
        summaryBlock(e));
    }
    const tokens = e.tokens_forwarded !== e.tokens && e.tokens !== null ? `${num(e.tokens)} → ${num(e.tokens_forwarded)} tok` : `${num(e.tokens)} tok`;
    return h("li", { class: `ent m-${e.fate}`, "data-fate": e.fate, "data-index": e.index },
      h("div", { class: "ent-head" },
        h("span", { class: `badge f-${e.fate}-b`, text: e.fate }),
        h("b", { text: `#${e.index}` }),
        h("span", { class: "role", text: e.role || roleOf(e.message) }),
        e.reason ? h("span", { class: "muted", text: e.reason }) : null,
        typeof e.score === "number" ? h("span", { class: "score", text: `score ${e.score.toFixed(3)}` }) : null,
        h("span", { class: "grow" }),
        h("span", { class: "muted", text: tokens })),
      e.message === null ? h("p", { class: "muted small", text: "(not stored)" }) : clampText(msgText(e.message)));
  }

  function renderSummaries(s) {
    const list = s.summaries.map((sm) =>
      h("article", { class: "summary-card" },
        h("h3", {}, `Summary #${sm.id} `, h("span", { class: "muted small", text: `covers up to item ${sm.covers_item_id}${sm.start_unit ? `, from turn ${sm.start_unit}` : ""}${sm.on_current_branch ? "" : " (another branch)"}` })),
        h("p", { class: "muted small", text: `${sm.model || "?"} · prompt ${String(sm.prompt_hash || "–").slice(0, 10)} · ${utc(sm.created_at)} UTC · forwarded by ${sm.used_by.length ? sm.used_by.map(reqLabel).join(", ") : "no request yet"}` }),
        summaryBlock(sm)));
    $("sum-list").replaceChildren(...(list.length ? list : [h("p", { class: "muted", text: "No summaries for this session." })]));
  }

  // -- events ----------------------------------------------------------------

  function onTimelineKey(event) {
    if (!["ArrowDown", "ArrowUp", "Home", "End"].includes(event.key)) return;
    const links = [...$("timeline").querySelectorAll("a.req")];
    if (!links.length) return;
    const at = links.indexOf(document.activeElement);
    let next = at;
    if (event.key === "ArrowDown") next = Math.min(links.length - 1, at + 1);
    else if (event.key === "ArrowUp") next = Math.max(0, at - 1);
    else if (event.key === "Home") next = 0;
    else next = links.length - 1;
    event.preventDefault();
    const link = links[next];
    link.focus();
    // Moving along the list shows each request without filling the history.
    history.replaceState(null, "", link.getAttribute("href"));
    state.route = parseRoute();
    select(link.dataset.id, false);
  }

  function start() {
    $("login-form").addEventListener("submit", login);
    $("logout").addEventListener("click", () => signOut("Key forgotten."));
    $("pause").addEventListener("click", () => {
      state.paused = !state.paused;
      $("pause").setAttribute("aria-pressed", String(state.paused));
      $("pause").textContent = state.paused ? "Resume" : "Pause";
      live(state.paused ? "Paused" : "Live");
      if (state.paused) clearTimeout(state.timer);
      else refresh(true);
    });
    $("search").addEventListener("submit", (event) => {
      event.preventDefault();
      location.hash = listHref($("q").value.trim(), 0);
    });
    $("prev").addEventListener("click", () => {
      const r = state.route;
      location.hash = listHref(r.q, Math.max(0, r.offset - PAGE));
    });
    $("next").addEventListener("click", () => {
      const r = state.route;
      location.hash = listHref(r.q, r.offset + PAGE);
    });
    $("timeline").addEventListener("keydown", onTimelineKey);
    window.addEventListener("hashchange", route);
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && state.key && !state.paused) refresh(true);
    });
    route();
  }

  start();
})();
