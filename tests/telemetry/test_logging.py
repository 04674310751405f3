"""log_line writes the line structlog would, without its per-call machinery."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import orjson
import pytest
import structlog

from proxy.telemetry.logging import configure_logging, get_logger, log_line


@pytest.fixture
def restore_structlog() -> Iterator[None]:
    """configure_logging's changes undone: structlog's and the standard library's."""
    saved = structlog.get_config()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error")]
    state = [(lg.handlers, lg.level, lg.propagate) for lg in loggers]
    yield
    structlog.configure(**saved)
    for lg, (handlers, level, propagate) in zip(loggers, state, strict=True):
        lg.handlers, lg.propagate = handlers, propagate
        lg.setLevel(level)


def _fields() -> dict[str, object]:
    return {
        "request_id": "abc",
        "session": "s-1",
        "status": 200,
        "tokens_before": 12,
        "reason": None,
        "ratio": 0.5,
        "api_key": "sk-leak",
        "nested": {"a": [1, 2]},
    }


def test_a_direct_line_is_the_line_structlog_writes(capsys, restore_structlog):
    configure_logging("info", "json")
    get_logger().info("request_completed", **_fields())
    log_line("info", "request_completed", _fields())
    log_line("warning", "request_completed", _fields())
    through, direct, warned = (orjson.loads(x) for x in capsys.readouterr().out.splitlines())
    stamp = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{6})?Z$"
    assert re.match(stamp, through["timestamp"]) and re.match(stamp, direct["timestamp"])
    through.pop("timestamp"), direct.pop("timestamp")
    # The same fields, in the same order, the secret redacted in both.
    assert list(direct.items()) == list(through.items())
    assert direct["api_key"] == "[redacted]" and direct["level"] == "info"
    # Names seen before (the later lines): still redacted.
    assert warned["level"] == "warning" and warned["api_key"] == "[redacted]"


def test_a_direct_line_respects_the_level(capsys, restore_structlog):
    configure_logging("warning", "json")
    log_line("info", "request_completed", _fields())
    assert capsys.readouterr().out == ""
    log_line("warning", "request_completed", _fields())
    assert orjson.loads(capsys.readouterr().out)["status"] == 200


def test_captured_logs_see_direct_lines(restore_structlog):
    configure_logging("info", "json")
    with structlog.testing.capture_logs() as logs:
        log_line("info", "request_completed", _fields())
    assert [e["event"] for e in logs] == ["request_completed"]
    assert logs[0]["session"] == "s-1" and logs[0]["log_level"] == "info"


def test_a_console_configuration_renders_through_structlog(capsys, restore_structlog):
    configure_logging("info", "console")
    log_line("info", "request_completed", _fields())
    out = capsys.readouterr().out
    assert "request_completed" in out and "session=s-1" in out and "sk-leak" not in out
