"""``server.client_keys``: the keys clients must present, read once at load.

Either a list (each entry ``os.environ/NAME``, named NAME, or
``{name: NAME, key: os.environ/VAR}``) or ``{file: PATH}``: a file of
``name sha256-hex`` lines (``#`` comments), relative to the config file.
Keys never appear in the file itself: only references or hashes.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.config.model import ENV_PREFIX, ClientKey
from proxy.config.node import EnvStr, show
from proxy.errors import ConfigError

_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def parse_client_keys(path: str, raw: Any, base_dir: Path) -> tuple[ClientKey, ...]:
    if raw is None:
        return ()
    if isinstance(raw, Mapping):
        if set(raw) != {"file"} or not isinstance(raw["file"], str):
            raise ConfigError(path, f"must be a list of keys or {{file: PATH}}, got {show(raw)}")
        return _from_file(f"{path}.file", base_dir / raw["file"])
    if not isinstance(raw, list) or not raw:
        raise ConfigError(path, f"must be a non-empty list or {{file: PATH}}, got {show(raw)}")
    keys = [_entry(f"{path}[{i}]", entry) for i, entry in enumerate(raw)]
    return _unique(path, keys)


def _entry(path: str, entry: Any) -> ClientKey:
    name: Any
    ref: Any
    if isinstance(entry, EnvStr):  # os.environ/NAME, resolved by the loader
        name, ref = entry.env_name, entry
    elif isinstance(entry, str):
        name, ref = entry[len(ENV_PREFIX) :], entry
    elif isinstance(entry, Mapping) and set(entry) == {"name", "key"}:
        name, ref = entry["name"], entry["key"]
    else:
        raise ConfigError(path, f"must be os.environ/NAME or {{name, key}}, got {show(entry)}")
    if not isinstance(ref, str) or not (isinstance(ref, EnvStr) or ref.startswith(ENV_PREFIX)):
        raise ConfigError(path, "must be an os.environ/NAME reference, not the key itself")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigError(path, f"name must be 1-64 letters, digits or _.:-, got {show(name)}")
    value: str | None = str(ref)
    if not isinstance(ref, EnvStr):
        var = ref[len(ENV_PREFIX) :]
        value = os.environ.get(var)
        if not value:
            raise ConfigError(path, f"environment variable {var} is not set")
    return ClientKey(name=name, sha256=key_hash(str(value)))


def _from_file(path: str, file: Path) -> tuple[ClientKey, ...]:
    try:
        lines = file.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(path, f"cannot read {str(file)!r}: {exc.strerror}") from exc
    keys: list[ClientKey] = []
    for n, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        parts = text.split()
        if len(parts) != 2 or not _NAME.fullmatch(parts[0]) or not _HEX64.fullmatch(parts[1]):
            raise ConfigError(f"{path}: {file}:{n}", "must be 'NAME SHA256-HEX'")
        keys.append(ClientKey(name=parts[0], sha256=parts[1]))
    if not keys:
        raise ConfigError(path, f"{file} holds no keys")
    return _unique(path, keys)


def _unique(path: str, keys: list[ClientKey]) -> tuple[ClientKey, ...]:
    names = [k.name for k in keys]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(path, f"the name {name!r} is given twice")
    return tuple(keys)
