"""Print `make reliability`'s figures (the JSON lines tests/reliability wrote) as one table.

python bench/reliability.py .reliability.jsonl
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import orjson


def table(path: Path) -> str:
    figures: dict[str, list[str]] = defaultdict(list)
    for line in path.read_bytes().splitlines():
        if line.strip():
            entry = orjson.loads(line)
            figures[entry["name"]].append(f"{entry['value']} {entry['unit']}".strip())
    rows: list[tuple[str, str]] = []
    for name, values in figures.items():
        if name == "upstream fault survived":
            faults = [v for v in values if not v.startswith("ok ")]
            rows.append(
                ("upstream faults survived", f"{len(faults)} (10 faults, plain and streamed)")
            )
        else:
            rows.append((name, "; ".join(values)))
    width = max(len(name) for name, _ in rows) if rows else 10
    lines = [f"| {'figure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name.ljust(width)} | {value} |" for name, value in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(Path(sys.argv[1] if len(sys.argv) > 1 else ".reliability.jsonl")))
