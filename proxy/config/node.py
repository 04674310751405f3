"""Reading one mapping of the YAML: typed getters whose errors name the key's path.

Inside :func:`collecting` (the loader parses every file that way) a getter
that meets a bad value records the problem and answers its default, an
unknown key is recorded and skipped, and :func:`section` records an error
that aborts one part (an upstream, a policy, a route): the file's problems
are then raised together, as one :class:`~proxy.errors.ConfigErrors`.
Outside it, the first problem raises, as a plain :class:`ConfigError`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from proxy.config.model import ENV_PREFIX
from proxy.errors import ConfigError, ConfigErrors

T = TypeVar("T")


class EnvStr(str):
    """A string read from the environment through an ``os.environ/NAME`` reference."""

    env_name: str

    def __new__(cls, value: str, env_name: str) -> EnvStr:
        self = super().__new__(cls, value)
        self.env_name = env_name
        return self


@dataclass
class Parse:
    """One file being parsed: its problems so far, and the folder its paths are relative to."""

    # None: the config came from no file; relative paths stay as written (the cwd's).
    base_dir: Path | None
    problems: list[ConfigError] = field(default_factory=list)
    # Every mapping read and the keys it allows (None: any): the schema's drift test.
    nodes: list[tuple[str, frozenset[str] | None]] = field(default_factory=list)

    def add(self, error: ConfigError) -> None:
        # One problem per path: a value already reported bad (an unset variable,
        # a wrong type) is not reported again by what read it next, nor is its
        # mapping's complaint that follows from the default used instead.
        if not any(_related(error.path, seen.path) for seen in self.problems):
            self.problems.append(error)


def _related(a: str, b: str) -> bool:
    if a == b:
        return True
    if not a or not b:
        return False
    inner, outer = (a, b) if len(a) > len(b) else (b, a)
    return inner.startswith((outer + ".", outer + "["))


_PARSE: ContextVar[Parse | None] = ContextVar("ctxproxy_config_parse", default=None)


@contextmanager
def collecting(base_dir: Path | None) -> Iterator[Parse]:
    """Collect every problem met inside; raise them together at the end."""
    parse = Parse(base_dir)
    token = _PARSE.set(parse)
    try:
        yield parse
    except ConfigError as exc:
        # Raised outside any section(): it ends the parse, with what was found before.
        parse.add(exc)
    finally:
        _PARSE.reset(token)
    if parse.problems:
        raise ConfigErrors(parse.problems)


def report(error: ConfigError) -> None:
    """Record a problem and carry on (inside :func:`collecting`); raise it otherwise."""
    parse = _PARSE.get()
    if parse is None:
        raise error
    parse.add(error)


def section(read: Callable[..., T], *args: Any) -> T | None:
    """``read(*args)``, or None when it raised a ConfigError (recorded: the rest goes on)."""
    try:
        return read(*args)
    except ConfigError as exc:
        report(exc)
        return None


def resolve_path(value: str) -> str:
    """A path from the config, relative ones taken from the config file's folder."""
    parse = _PARSE.get()
    if value == ":memory:" or parse is None or parse.base_dir is None:
        return value
    path = Path(value).expanduser()
    return os.path.normpath(path if path.is_absolute() else parse.base_dir / path)


def resolve_env(value: Any, path: str = "") -> Any:
    """``value`` with every ``os.environ/NAME`` string replaced by the variable's value.

    An unset (or empty) variable is a problem named by the key's path; its
    value is left as written.
    """
    if isinstance(value, str):
        if not value.startswith(ENV_PREFIX) or isinstance(value, EnvStr):
            return value
        name = value[len(ENV_PREFIX) :]
        resolved = os.environ.get(name)
        if not resolved:
            report(ConfigError(path, f"environment variable {name} is not set"))
            return value
        return EnvStr(resolved, name)
    if isinstance(value, Mapping):
        return {k: resolve_env(v, f"{path}.{k}" if path else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_env(v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


class Node:
    """A mapping being read, with the path used in error messages."""

    def __init__(self, path: str, value: Any, allowed: set[str]) -> None:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be a mapping, got {show(value)}")
        parse = _PARSE.get()
        if parse is not None:
            parse.nodes.append((path, None if isinstance(allowed, AnyKeys) else frozenset(allowed)))
        unknown = sorted(str(k) for k in value if k not in allowed)
        for key in unknown:
            where = f"{path}.{key}" if path else key
            report(ConfigError(where, f"unknown key (allowed: {', '.join(sorted(allowed))})"))
        self.path = path
        self.value: Mapping[str, Any] = {k: v for k, v in value.items() if k in allowed}

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.value and self.value[key] is not None

    def raw(self, key: str) -> Any:
        return self.value.get(key)

    def bad(self, key: str, message: str) -> None:
        """Report a bad value of ``key`` (the caller then uses its default)."""
        report(ConfigError(self.at(key), message))

    def text(self, key: str, default: str | None = None, *, env: bool = True) -> str | None:
        # Every string may be an os.environ/NAME reference (the loader resolves
        # them all up front; this covers a Node read outside the loader).
        if not self.has(key):
            return default
        value = self.value[key]
        if not isinstance(value, str):
            self.bad(key, f"must be a string, got {show(value)}")
            return default
        if env and value.startswith(ENV_PREFIX) and not isinstance(value, EnvStr):
            resolved = resolve_env(value, self.at(key))
            return default if resolved is value else str(resolved)
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A boolean (an ``os.environ/NAME`` holding true or false is accepted too)."""
        if not self.has(key):
            return default
        value = self.value[key]
        if isinstance(value, EnvStr) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        if not isinstance(value, bool):
            self.bad(key, f"must be true or false, got {show(value)}")
            return default
        return value

    def path_value(self, key: str, default: str | None = None) -> str | None:
        """A filesystem path: relative ones are taken from the config file's folder."""
        value = self.text(key, default)
        return None if value is None else resolve_path(value)

    def required_str(self, key: str) -> str:
        value = self.text(key)
        if value is None:
            raise ConfigError(self.at(key), "is required")
        return value

    def integer(
        self,
        key: str,
        default: int | None = None,
        *,
        minimum: int = 0,
        maximum: int | None = None,
    ) -> int | None:
        if not self.has(key):
            return default
        value = self.value[key]
        if isinstance(value, EnvStr) and value.strip().lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            self.bad(key, f"must be an integer, got {show(value)}")
            return default
        if value < minimum:
            self.bad(key, f"must be >= {minimum}, got {value}")
            return default
        if maximum is not None and value > maximum:
            self.bad(key, f"must be <= {maximum}, got {value}")
            return default
        return value

    def number(
        self, key: str, default: float | None = None, *, low: float = 0.0, high: float | None = None
    ) -> float | None:
        if not self.has(key):
            return default
        value = self.value[key]
        if isinstance(value, EnvStr):
            with suppress(ValueError):
                value = float(value)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.bad(key, f"must be a number, got {show(value)}")
            return default
        if value <= low or (high is not None and value > high):
            bound = f"> {low}" + (f" and <= {high}" if high is not None else "")
            self.bad(key, f"must be {bound}, got {value}")
            return default
        return float(value)

    def str_map(self, key: str) -> dict[str, str]:
        value = self.raw(key) or {}
        if not isinstance(value, Mapping):
            self.bad(key, f"must be a mapping, got {show(value)}")
            return {}
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(v, str):
                report(ConfigError(f"{self.at(key)}.{k}", f"must be a string, got {show(v)}"))
                continue
            out[str(k)] = v
        return out

    def child(self, key: str, allowed: set[str]) -> Node:
        return Node(self.at(key), self.raw(key), allowed)


def show(value: Any) -> str:
    return repr(value) if not isinstance(value, Mapping | list) else type(value).__name__


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(node: Node, key: str) -> float | None:
    """A duration like ``30m``, ``12h`` or ``7d`` (also ``s``), in seconds."""
    if not node.has(key):
        return None
    value = node.raw(key)
    found = _DURATION.fullmatch(value.strip()) if isinstance(value, str) else None
    if found is None or float(found.group(1)) <= 0:
        node.bad(key, f"must be a positive duration like 30m, 12h or 7d, got {show(value)}")
        return None
    return float(found.group(1)) * _UNIT_SECONDS[found.group(2)]


class AnyKeys(set[str]):
    """Allowed-keys marker for nodes whose keys are checked later by their parser."""

    def __contains__(self, key: object) -> bool:
        return True


ANY = AnyKeys()
