"""Validate bodies against the official OpenAI OpenAPI spec in ../shared/data."""

from __future__ import annotations

import functools
import json
from typing import Any

from openapi_schema_validator import OAS31Validator

from tests.shared_data import shared_file


@functools.cache
def _components() -> dict[str, Any]:
    with shared_file("openai-openapi.json").open() as f:
        spec = json.load(f)
    return dict(_nullable_to_31(spec["components"]))


def _nullable_to_31(node: Any) -> Any:
    """The spec still carries OpenAPI 3.0 `nullable: true` flags; express them in 3.1 terms."""
    if isinstance(node, list):
        return [_nullable_to_31(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_31(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
            if isinstance(out.get("enum"), list) and None not in out["enum"]:
                out["enum"] = [*out["enum"], None]
        else:
            return {"anyOf": [out, {"type": "null"}]}
    return out


def validate(schema: str, instance: Any) -> None:
    """Raise jsonschema.ValidationError if ``instance`` is not a valid ``schema``."""
    ref = {"$ref": f"#/components/schemas/{schema}", "components": _components()}
    OAS31Validator(ref).validate(instance)
