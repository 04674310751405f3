"""Reading one mapping of the YAML: typed getters whose errors name the key's path."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from proxy.config.model import ENV_PREFIX
from proxy.errors import ConfigError


class Node:
    """A mapping being read, with the path used in error messages."""

    def __init__(self, path: str, value: Any, allowed: set[str]) -> None:
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be a mapping, got {show(value)}")
        unknown = sorted(str(k) for k in value if k not in allowed)
        if unknown:
            where = f"{path}.{unknown[0]}" if path else unknown[0]
            raise ConfigError(where, f"unknown key (allowed: {', '.join(sorted(allowed))})")
        self.path = path
        self.value: Mapping[str, Any] = value

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.value and self.value[key] is not None

    def raw(self, key: str) -> Any:
        return self.value.get(key)

    def text(self, key: str, default: str | None = None, *, env: bool = False) -> str | None:
        if not self.has(key):
            return default
        value = self.value[key]
        if not isinstance(value, str):
            raise ConfigError(self.at(key), f"must be a string, got {show(value)}")
        if env and value.startswith(ENV_PREFIX):
            name = value[len(ENV_PREFIX) :]
            resolved = os.environ.get(name)
            if not resolved:
                raise ConfigError(self.at(key), f"environment variable {name} is not set")
            return resolved
        return value

    def required_str(self, key: str) -> str:
        value = self.text(key)
        if value is None:
            raise ConfigError(self.at(key), "is required")
        return value

    def integer(self, key: str, default: int | None = None, *, minimum: int = 0) -> int | None:
        if not self.has(key):
            return default
        value = self.value[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(self.at(key), f"must be an integer, got {show(value)}")
        if value < minimum:
            raise ConfigError(self.at(key), f"must be >= {minimum}, got {value}")
        return value

    def number(
        self, key: str, default: float | None = None, *, low: float = 0.0, high: float | None = None
    ) -> float | None:
        if not self.has(key):
            return default
        value = self.value[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(self.at(key), f"must be a number, got {show(value)}")
        if value <= low or (high is not None and value > high):
            bound = f"> {low}" + (f" and <= {high}" if high is not None else "")
            raise ConfigError(self.at(key), f"must be {bound}, got {value}")
        return float(value)

    def str_map(self, key: str) -> dict[str, str]:
        value = self.raw(key) or {}
        if not isinstance(value, Mapping):
            raise ConfigError(self.at(key), f"must be a mapping, got {show(value)}")
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(v, str):
                raise ConfigError(f"{self.at(key)}.{k}", f"must be a string, got {show(v)}")
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
        raise ConfigError(
            node.at(key), f"must be a positive duration like 30m, 12h or 7d, got {show(value)}"
        )
    return float(found.group(1)) * _UNIT_SECONDS[found.group(2)]


class AnyKeys(set[str]):
    """Allowed-keys marker for nodes whose keys are checked later by their parser."""

    def __contains__(self, key: object) -> bool:
        return True


ANY = AnyKeys()
