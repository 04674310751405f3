"""A coding agent's command run the way the tests run every agent: in its work folder,
no input, the environment given (nothing of the caller's), output captured."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class AgentRun:
    returncode: int
    stdout: str
    stderr: str


def run_agent(command: list[str], work: Path, env: dict[str, str], timeout: float) -> AgentRun:
    done = subprocess.run(
        command,
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return AgentRun(done.returncode, done.stdout, done.stderr)
