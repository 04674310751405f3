"""`python -m proxy sessions request ID`: what one request forwarded, item by item.

Prints :func:`proxy.ops.admin_views.request_context` (what ``GET
/admin/requests/{id}/context`` and the viewer show): the token split, then
every message the request was sent with its fate and tokens, the summary
where it stood in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TextIO

SENT = ("kept", "clipped", "masked", "summarized", "recalled", "dropped", "other")
FORWARDED = ("kept", "clipped", "masked", "summary", "recalled", "other")


def _split_line(label: str, total: int, parts: dict[str, int], names: tuple[str, ...]) -> str:
    shown = ", ".join(f"{name} {parts[name]}" for name in names if parts.get(name))
    return f"{label:10} {total:7d}  ({shown or 'nothing'})"


def print_context(
    ctx: dict[str, Any], out: TextIO, preview: Callable[[dict[str, Any], int], str]
) -> None:
    """``preview`` shortens a message to one line (the CLI's own)."""
    r = ctx["request"]
    t = r["tokens"]
    split = t["split"]
    mode = f", mode {r['mode']}" if r["mode"] else ""
    print(f"request {r['id']} ({r['created_at']}): policy {r['policy']}{mode}", file=out)
    print(_split_line("sent", t["before"], split["sent"], SENT), file=out)
    print(_split_line("forwarded", t["after"], split["forwarded"], FORWARDED), file=out)
    if not split["exact"]:
        print("(some messages' tokens are unknown: counted as other)", file=out)
    if ctx["chain"] != "current_branch":
        print("(its messages are not on the session's current branch: positions only)", file=out)
    print(f"\n{'pos':>4} {'fate':10} {'role':10} {'tokens':>13} {'item':>6} content", file=out)
    for e in ctx["entries"]:
        if e["kind"] == "summary":
            print(
                f"{'':>4} {'summary':10} {'':10} {e['tokens'] or 0:>13} {'':>6} "
                f"#{e['summary_id']} for {e['stands_in_for']} messages ({e['turns']} turns)",
                file=out,
            )
            continue
        sent, forwarded = e["tokens"], e["tokens_forwarded"]
        tokens = "-" if sent is None else f"{sent}" if sent == forwarded else f"{sent}->{forwarded}"
        fate = e["fate"]
        if e.get("score") is not None:
            fate += f" {e['score']:.2f}"
        elif e["reason"]:
            fate += f" ({e['reason']})"
        item = "-" if e["item_id"] is None else str(e["item_id"])
        text = "" if e["message"] is None else preview(e["message"], 50)
        print(
            f"{e['index']:4d} {fate:10} {e['role'] or '-':10} {tokens:>13} {item:>6} {text}",
            file=out,
        )
