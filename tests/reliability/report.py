"""Figures the reliability tests measure, collected for `make reliability`'s table.

With RELIABILITY_REPORT set to a file, each figure is appended to it as one
JSON line; bench/reliability.py prints them as one table.
"""

from __future__ import annotations

import os

import orjson


def figure(name: str, value: float | int | str, unit: str = "") -> None:
    path = os.environ.get("RELIABILITY_REPORT")
    print(f"reliability: {name} = {value} {unit}".rstrip())
    if path:
        with open(path, "ab") as f:
            f.write(orjson.dumps({"name": name, "value": value, "unit": unit}) + b"\n")
