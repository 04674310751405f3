"""A long Codex coding session with planted facts, and the requests Codex sent for it.

The task: Codex reads a project's notes one file at a time (each a shell
command whose output holds one fact, a port, a code, a name, among lines of
build log), with an auto-compaction limit low enough that Codex compacts
several times before it is done. ``record`` runs it through the proxy with
compaction relayed to a fake upstream that answers it as OpenAI does, and
keeps every request Codex sent, redacted (its built-in instructions and tool
descriptions shortened, temporary paths and ids replaced), as
tests/data/codex-session.json:

- tests/agents/test_codex_compaction.py drives the standalone
  ``/v1/responses/compact`` endpoint with the compaction requests in it;
- bench/agents.py replays the session's items through the proxy.

    python -m tests.agents.session   # re-record (needs `make node`)
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "data" / "codex-session.json"


@dataclass(frozen=True)
class Fact:
    file: str
    question: str
    answer: str
    line: str


FACTS = [
    Fact("db.env", "Which port did db.env give the billing database?", "7311", "DB_PORT=7311"),
    Fact(
        "owner.txt",
        "Who does owner.txt name as the owner?",
        "Dana Whitfield",
        "owner: Dana Whitfield",
    ),
    Fact(
        "errors.md", "Which code means a stale ledger in errors.md?", "E4207", "E4207 stale ledger"
    ),
    Fact(
        "cron.txt", "When does the export run, per cron.txt?", "02:45", "export runs at 02:45 UTC"
    ),
    Fact(
        "queue.env", "What visibility timeout does queue.env set?", "93s", "VISIBILITY_TIMEOUT=93s"
    ),
    Fact(
        "region.txt",
        "Which failover region is in region.txt?",
        "eu-north-1",
        "failover: eu-north-1",
    ),
    Fact(
        "flags.txt",
        "Which flag gates refunds, per flags.txt?",
        "refund_v3",
        "flag refund_v3 gates refunds",
    ),
    Fact("limits.env", "What rate limit does limits.env set?", "417/min", "RATE_LIMIT=417/min"),
    Fact(
        "bucket.txt",
        "Which bucket does bucket.txt name?",
        "inv-archive-88",
        "bucket inv-archive-88",
    ),
    Fact("oncall.txt", "Who is on call, per oncall.txt?", "Priya Raman", "on call: Priya Raman"),
    Fact(
        "cert.txt",
        "When does the cert in cert.txt expire?",
        "2027-03-14",
        "cert expires 2027-03-14",
    ),
    Fact("replica.env", "How many read replicas does replica.env set?", "5", "READ_REPLICAS=5"),
]
PROMPT = "Read every file under notes/ one at a time and tell me when you are done."
# Lines of build log around each fact, so the history grows as a real session's does.
NOISE_LINES = 60


def command(fact: Fact) -> str:
    """The shell command that writes the fact's file, with noise, and prints it."""
    return (
        f"mkdir -p notes && {{ seq -f 'build step %g ok' 1 {NOISE_LINES}; "
        f"echo '{fact.line}'; seq -f 'lint pass %g clean' 1 {NOISE_LINES}; }} "
        f"> notes/{fact.file} && cat notes/{fact.file}"
    )


# The temporary folder the recording ran in (Codex's home and work folder are under it).
_TMP = re.compile(r"/tmp/[^\s\"'<>/`]+")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Redactor:
    """Codex's requests made small and anonymous, their shapes untouched.

    The temporary folder becomes ``/tmp/codex`` and ids (uuids) numbered placeholders; the
    built-in instructions (developer messages) and tool descriptions are cut
    short. What the task itself said, the tool calls and their outputs, is kept
    whole.
    """

    def __init__(self) -> None:
        self.ids: dict[str, str] = {}

    def _uuid(self, match: re.Match[str]) -> str:
        return self.ids.setdefault(match.group(0), f"00000000-0000-7000-8000-{len(self.ids):012d}")

    def __call__(self, value: Any, limit: int | None = None, key: str = "") -> Any:
        if isinstance(value, dict):
            if value.get("role") == "developer":
                limit = 600
            return {k: self(v, limit, k) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v, limit, key) for v in value]
        if isinstance(value, str):
            value = _UUID.sub(self._uuid, _TMP.sub("/tmp/codex", value))
            cut = 120 if key == "description" else limit
            if cut is not None and len(value) > cut:
                return value[:cut] + f" [... {len(value) - cut} characters left out]"
        return value


def pack(bodies: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Requests with their tools and items stored once: each input a list of item numbers."""
    redact = Redactor()
    tools: list[Any] = []
    items: list[Any] = []
    seen: dict[str, int] = {}
    requests = []
    for kind, body in bodies:
        body = redact(body)
        if not tools:
            tools = body["tools"]
        assert body.pop("tools") == tools, "Codex changed its tools mid-session"
        numbers = []
        for item in body.pop("input"):
            numbers.append(seen.setdefault(json.dumps(item, sort_keys=True), len(items)))
            if numbers[-1] == len(items):
                items.append(item)
        requests.append({"request_kind": kind, "body": body, "input": numbers})
    return {"tools": tools, "items": items, "requests": requests}


def unpack(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The requests ``pack`` stored: (Codex's request_kind, the body as sent)."""
    return [
        (
            r["request_kind"],
            {**r["body"], "input": [data["items"][n] for n in r["input"]], "tools": data["tools"]},
        )
        for r in data["requests"]
    ]


def load(path: Path = RECORDED) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def record(path: Path = RECORDED) -> None:
    from tests.agents.codex import locked_version, run_codex
    from tests.fakes.coding_task import CodingTask
    from tests.harness import AiohttpServer, LoopThread, ProxyServer, make_config

    loop = LoopThread()
    fake = CodingTask(commands=[command(f) for f in FACTS], compaction=True)
    upstream = AiohttpServer(loop, fake.app())
    with tempfile.TemporaryDirectory() as tmp:
        # Relayed, so the fake upstream records Codex's compaction requests as sent.
        route = {
            "match": {"path": "/v1/responses"},
            "upstream": "default",
            "compaction": "upstream",
        }
        routes = [route]
        proxy = ProxyServer(loop, make_config(upstream.url, Path(tmp), routes=routes))
        try:
            run = run_codex(Path(tmp), proxy.url, PROMPT, auto_compact_tokens=AUTO_COMPACT)
        finally:
            proxy.stop()
            upstream.stop()
            loop.stop()
    if run.returncode != 0:
        sys.exit(f"codex failed:\n{run.stderr[-3000:]}")
    sent = [
        (json.loads(r.headers["x-codex-turn-metadata"])["request_kind"], r.json)
        for r in fake.received
        if r.method == "POST" and isinstance(r.json, dict)
    ]
    data = {
        "codex_version": locked_version(),
        "prompt": PROMPT,
        "auto_compact_tokens": AUTO_COMPACT,
        "facts": [f.__dict__ for f in FACTS],
        **pack(sent),
    }
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    kinds = [kind for kind, _ in sent]
    print(f"{path}: {len(sent)} requests ({kinds.count('compaction')} compactions)")


# Codex's built-in instructions are about 5,400 tokens of input (as the fake
# counts them); each fact's command adds about 500.
AUTO_COMPACT = 7000

if __name__ == "__main__":
    record()
