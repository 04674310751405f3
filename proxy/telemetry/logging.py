"""structlog set-up: JSON lines when stdout is not a TTY, a console otherwise.

Message content is never logged at info level, and neither is any key: the
``_redact`` processor drops fields whose names say they hold secrets, as a
second line of defence behind the call sites.
"""

from __future__ import annotations

import json
import logging
import sys
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
    keys = event.keys()
    new = keys - _KNOWN
    if new:
        secret = {k for k in new if _is_secret(k)}
        if len(_KNOWN) < _MAX_KNOWN:
            _KNOWN.update(new)
            _SECRET.update(secret)
        for key in secret:
            event[key] = "[redacted]"
    for key in keys & _SECRET:
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
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        # One shared PrintLogger: the factory runs on every log call (loggers are not
        # cached, so tests can capture them), and building one each time is waste.
        logger_factory=_shared_logger(structlog.PrintLogger(file=sys.stdout)),
        cache_logger_on_first_use=False,
    )
    _route_stdlib_logging(level, renderer)


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
