"""The read-only data in ../shared/data; tests skip with a reason when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def shared_file(name: str) -> Path:
    path = SHARED / "data" / name
    if not path.exists():
        pytest.skip(f"../shared/data/{name} is not available")
    return path
