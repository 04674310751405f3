"""Where the benchmarks find the conversations they replay (not shipped with the project).

``CTXPROXY_BENCH_DATA`` names the folder that holds ``locomo-dev.json`` and
``tau-airline-dev.json`` (docs/benchmarks/README.md: where they come from and
how to make them); without it, the folder the project's development
checkouts keep them in, beside the clone. A bench whose files are absent
says ``skipped``.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("CTXPROXY_BENCH_DATA") or ROOT.parent / "shared" / "data")
LOCOMO = DATA / "locomo-dev.json"
TAU = DATA / "tau-airline-dev.json"
