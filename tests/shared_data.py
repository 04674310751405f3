"""The read-only data in ../shared/data; tests skip with a reason when it is absent."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
# Every skip of a test for want of the shared data starts so: the summary lists those tests.
REASON = "needs the shared data sets beside the checkout"


def shared_file(name: str) -> Path:
    path = SHARED / "data" / name
    if not path.exists():
        pytest.skip(f"{REASON}: ../shared/data/{name} is not available")
    return path
