"""structlog set-up: JSON lines when stdout is not a TTY, a console otherwise.

Message content is never logged at info level, and neither is any key: the
``_redact`` processor drops fields whose names say they hold secrets, as a
second line of defence behind the call sites.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import orjson
import structlog

_SECRET_WORDS = ("authorization", "api_key", "apikey", "password", "secret", "token_value")


# Field names seen, and those naming a secret. Field names come from the code
# (a few dozen), so each is checked once and a line costs two set operations in
# C: the scan of every name on every line was two thirds of a request_completed
# line's cost (issue 16). Bounded, in case a caller ever logs arbitrary names.
_KNOWN: set[str] = set()
_SECRET: set[str] = set()
_MAX_KNOWN = 4096


def _is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def _redact(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # issuperset / isdisjoint look the names up without building sets of them (the
    # two set operations were a fifth of a request_completed line's instructions).
    if not _KNOWN.issuperset(event):
        new = event.keys() - _KNOWN
        secret = {k for k in new if _is_secret(k)}
        if len(_KNOWN) < _MAX_KNOWN:
            _KNOWN.update(new)
            _SECRET.update(secret)
        for key in secret:
            event[key] = "[redacted]"
    if _SECRET and not _SECRET.isdisjoint(event):
        for key in event.keys() & _SECRET:
            event[key] = "[redacted]"
    return event


def _dumps(event: Any, **kw: Any) -> str:
    """orjson (several times the standard library's speed); json for what orjson refuses
    (an integer past 64 bits, a non-string key), so a line is never lost."""
    try:
        return orjson.dumps(event, default=kw.get("default")).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(event, **kw)


def _shared_logger(logger: structlog.PrintLogger) -> Any:
    def factory(*args: Any) -> structlog.PrintLogger:
        return logger

    return factory


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    json_output = fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if json_output
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _redact,
        renderer,
    ]
    min_level = logging.getLevelNamesMapping()[level.upper()]
    wrapper = structlog.make_filtering_bound_logger(min_level)
    # One shared PrintLogger: the factory runs on every log call (loggers are not
    # cached, so tests can capture them), and building one each time is waste.
    printer = structlog.PrintLogger(file=sys.stdout)
    factory = _shared_logger(printer)
    structlog.configure(
        processors=processors,
        wrapper_class=wrapper,
        logger_factory=factory,
        cache_logger_on_first_use=False,
    )
    _DIRECT.clear()
    if json_output:
        _DIRECT.update(
            processors=list(processors),
            wrapper=wrapper,
            factory=factory,
            printer=printer,
            renderer=renderer,
            min_level=min_level,
        )
    _route_stdlib_logging(level, renderer)


# configure_logging's JSON set-up, for the lines log_line writes itself.
_DIRECT: dict[str, Any] = {}
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def log_line(level: str, event: str, fields: dict[str, Any]) -> None:
    """``get_logger().<level>(event, **fields)``: the same line, with the same processors,
    but without structlog's per-call machinery (a bound logger built per call, the
    fields copied twice): the ``request_completed`` line, once per request (issue 16).

    Only while the configuration is still configure_logging's JSON one; otherwise
    (tests capturing logs, a console) the line goes through structlog. ``fields``
    is consumed (it becomes the line's event dict).
    """
    direct = _DIRECT
    config = structlog.get_config()
    if (
        not direct
        or config["logger_factory"] is not direct["factory"]
        or config["wrapper_class"] is not direct["wrapper"]
        or config["processors"] != direct["processors"]
    ):
        getattr(get_logger(), level)(event, **fields)
        return
    if _LEVELS[level] < direct["min_level"]:
        return
    fields["event"] = event
    structlog.contextvars.merge_contextvars(None, level, fields)
    fields["level"] = level
    fields["timestamp"] = _timestamp()
    _redact(None, level, fields)
    direct["printer"].msg(direct["renderer"](None, level, fields))


# The current second's "YYYY-MM-DDTHH:MM:SS", rendered once a second.
_second: list[Any] = [-1, ""]


def _timestamp() -> str:
    """Now, as structlog's ``TimeStamper(fmt="iso", utc=True)`` writes it (microseconds
    left out when they are 0, as ``datetime.isoformat`` does)."""
    second, micros = divmod(time.time_ns() // 1000, 1_000_000)
    if second != _second[0]:
        _second[0], _second[1] = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
    return f"{_second[1]}.{micros:06d}Z" if micros else f"{_second[1]}Z"


def _route_stdlib_logging(level: str, renderer: Any) -> None:
    """Lines from the standard library's logging (uvicorn's, aiohttp's, asyncio's) rendered
    as ours: one JSON object per line, with the logger's name; tracebacks inside it."""
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
        ],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, _redact, renderer],
    )
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(logging.WARNING)  # other libraries: warnings and errors only
    for name in ("uvicorn", "uvicorn.error"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers = []
        uvicorn_logger.propagate = True
        uvicorn_logger.setLevel(logging.getLevelNamesMapping()[level.upper()])


def get_logger(name: str = "ctxproxy") -> Any:
    return structlog.get_logger(name)
