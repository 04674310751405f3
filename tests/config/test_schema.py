"""The config's JSON Schema: published by `ctxproxy schema`, committed, and true to the loader."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from proxy.config import node as node_module
from proxy.config.loader import load_config
from proxy.config.schema import config_schema

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config.example.yaml"
COMMITTED = REPO / "config.schema.json"


def validator() -> jsonschema.Draft202012Validator:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_committed_schema_is_what_the_command_prints():
    out = subprocess.run(
        [sys.executable, "-m", "proxy", "schema"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == COMMITTED.read_text(), (
        "config.schema.json is stale: run `python -m proxy schema -o config.schema.json`"
    )


def test_example_config_points_editors_at_the_schema():
    first = EXAMPLE.read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=./config.schema.json"


def test_schema_accepts_the_example_config():
    errors = list(validator().iter_errors(yaml.safe_load(EXAMPLE.read_text())))
    assert errors == [], [e.message for e in errors]


@pytest.mark.parametrize(
    "change",
    [
        {"server": {"port": 99999}},
        {"server": {"prot": 8080}},
        {"logging": {"level": "loud"}},
        {"policies": {"p": {"strategy": "trim", "max_turns": 0}}},
        {"policies": {"p": {"strategy": "magic"}}},
        {"routes": []},
        {"admin": {"api_key": "sk-literal"}},
        {"upstreams": {"u": {"timeout_s": 5}}},
    ],
)
def test_schema_rejects_what_the_loader_rejects(change):
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(change)
    assert list(validator().iter_errors(data)), change


def _locate(schema: dict[str, Any], path: str) -> list[dict[str, Any]]:
    """The schema object(s) describing the mapping at a loader path like routes[0].modes."""
    found = [schema]
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        nxt: list[dict[str, Any]] = []
        for s in found:
            for option in s.get("anyOf", [s]):
                if index:
                    nxt.append(option.get("items", {}))
                elif name in option.get("properties", {}):
                    nxt.append(option["properties"][name])
                elif isinstance(option.get("additionalProperties"), dict):
                    nxt.append(option["additionalProperties"])
        found = nxt
    return [option for s in found for option in s.get("anyOf", [s])]


def test_schema_names_exactly_the_keys_the_loader_reads(monkeypatch):
    # Every mapping the loader reads while parsing the example, with the keys it
    # allows, must be a schema object with those properties: a key added to the
    # loader but not to proxy/config/schema.py (or the reverse) fails here.
    parses: list[node_module.Parse] = []

    class Recording(node_module.Parse):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            parses.append(self)

    monkeypatch.setattr(node_module, "Parse", Recording)
    load_config(EXAMPLE)
    nodes = [(path, allowed) for p in parses for path, allowed in p.nodes if allowed is not None]
    assert len(nodes) > 10
    schema = config_schema()
    for path, allowed in nodes:
        candidates = [set(s.get("properties", {})) for s in _locate(schema, path)]
        assert set(allowed) in candidates, (
            f"{path or 'the top level'}: the loader allows {sorted(allowed)}, the schema has "
            f"{[sorted(c) for c in candidates]}: add the key to proxy/config/schema.py, "
            "then `python -m proxy schema -o config.schema.json`"
        )


def test_schema_command_writes_a_file(tmp_path):
    out = tmp_path / "s.json"
    subprocess.run([sys.executable, "-m", "proxy", "schema", "-o", str(out)], check=True, cwd=REPO)
    assert json.loads(out.read_text())["title"] == "ctxproxy config"
