"""Start-up: from starting `python -m proxy --config config.example.yaml` to its first /healthz 200.

What `make serve` runs, with the example config as it is (only the port and
the SQLite file moved to a temporary folder): the process is started, and
/healthz is polled every 5 ms until it answers 200. Also measured, in the
same interleaved rounds: the resident memory at that moment, and what
`import litellm` alone costs in a fresh interpreter (what the example config
no longer pays). The target (issue 12) is /healthz within 2 s.

    python bench/startup.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds the process used so far (robust on a shared machine)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def answers(port: int, path: str = "/healthz") -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=0.5) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def one_start(folder: Path) -> tuple[float, float, float, float]:
    """Seconds from spawning the proxy to /healthz 200, its CPU seconds and RSS (MB) then,
    and seconds to /readyz 200 (the token encodings loaded too)."""
    port = free_port()
    data = yaml.safe_load((REPO / "config.example.yaml").read_text())
    data["server"]["port"] = port
    data["store"]["path"] = str(folder / f"{port}.db")
    config = folder / f"{port}.yaml"
    config.write_text(yaml.safe_dump(data))
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "--config", str(config)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not answers(port):
            if process.poll() is not None:
                raise RuntimeError(f"the proxy exited with {process.returncode}")
            if time.perf_counter() - started > 60:
                raise RuntimeError("no /healthz answer within 60 s")
            time.sleep(0.005)
        elapsed = time.perf_counter() - started
        used, mb = cpu_s(process.pid), rss_mb(process.pid)
        while not answers(port, "/readyz"):
            if time.perf_counter() - started > 60:
                raise RuntimeError("no /readyz answer within 60 s")
            time.sleep(0.005)
        return elapsed, used, mb, time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(10)


def litellm_import() -> float:
    code = (
        "import os, time; os.environ['LITELLM_LOCAL_MODEL_COST_MAP'] = 'True'; "
        "t = time.perf_counter(); import litellm; print(time.perf_counter() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    starts: list[float] = []
    ready: list[float] = []
    cpu: list[float] = []
    memory: list[float] = []
    imports: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            seconds, used, mb, ready_s = one_start(Path(tmp))
            starts.append(seconds)
            ready.append(ready_s)
            cpu.append(used)
            memory.append(mb)
            imports.append(litellm_import())
            print(
                f"round {i + 1}/{args.rounds}: /healthz after {seconds:.3f} s "
                f"({used:.2f} s CPU), RSS {mb:.0f} MB; "
                f"import litellm alone {imports[-1]:.3f} s",
                file=sys.stderr,
            )
    median = statistics.median(starts)
    print(f"start-up, config.example.yaml, {args.rounds} rounds")
    print(f"{'':28}{'median':>9}{'min':>9}{'max':>9}")
    print(f"{'spawn -> /healthz 200 (s)':28}{median:9.3f}{min(starts):9.3f}{max(starts):9.3f}")
    print(
        f"{'spawn -> /readyz 200 (s)':28}{statistics.median(ready):9.3f}{min(ready):9.3f}{max(ready):9.3f}"
    )
    print(f"{'CPU at /healthz (s)':28}{statistics.median(cpu):9.3f}{min(cpu):9.3f}{max(cpu):9.3f}")
    print(
        f"{'RSS at /healthz (MB)':28}{statistics.median(memory):9.0f}"
        f"{min(memory):9.0f}{max(memory):9.0f}"
    )
    print(
        f"{'import litellm alone (s)':28}{statistics.median(imports):9.3f}"
        f"{min(imports):9.3f}{max(imports):9.3f}"
    )
    verdict = "met" if median <= TARGET_S else "NOT met"
    print(f"target /healthz within {TARGET_S:g} s: {verdict} ({TARGET_S / median:.1f}x under it)")


if __name__ == "__main__":
    main()
