"""Installs are locked: what `make serve`, `make test`, CI and the Dockerfile install is pinned.

The lock files must pin, with hashes, every dependency pyproject.toml names
(at a version its specifier allows), and the runtime lock must agree with the
dev lock. A dependency added to pyproject.toml without `make lock` fails here,
saying so.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
RELOCK = (
    "run `make lock` (it makes ./.venv if missing and installs uv there; no other venv is touched) "
    "and commit requirements.lock and requirements-dev.lock"
)
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.M)


def pins(lock: str) -> dict[str, str]:
    text = (REPO / lock).read_text()
    found = {canonicalize_name(name): version for name, version in PIN.findall(text)}
    assert found, lock
    return found


def project() -> dict[str, list[str]]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {"runtime": data["dependencies"], "dev": data["optional-dependencies"]["dev"]}


@pytest.mark.parametrize(
    "lock", ["requirements.lock", "requirements-dev.lock", "requirements-pip.lock"]
)
def test_every_pin_carries_hashes(lock):
    blocks = re.split(r"\n(?=[A-Za-z0-9])", (REPO / lock).read_text())
    for block in blocks:
        if PIN.match(block):
            assert "--hash=sha256:" in block, block.splitlines()[0]


@pytest.mark.parametrize(
    ("lock", "groups"),
    [("requirements.lock", ["runtime"]), ("requirements-dev.lock", ["runtime", "dev"])],
)
def test_the_lock_pins_every_dependency_of_pyproject(lock, groups):
    pinned = pins(lock)
    for group in groups:
        for spec in project()[group]:
            req = Requirement(spec)
            name = canonicalize_name(req.name)
            assert name in pinned, f"{req.name} is not in {lock}: {RELOCK}"
            assert req.specifier.contains(pinned[name], prereleases=True), (
                f"{lock} pins {req.name}=={pinned[name]}, pyproject.toml wants {req.specifier}: "
                f"{RELOCK}"
            )


def test_runtime_lock_agrees_with_the_dev_lock():
    runtime, dev = pins("requirements.lock"), pins("requirements-dev.lock")
    assert {n: v for n, v in runtime.items() if dev.get(n) != v} == {}


def test_litellm_1_107_is_never_locked():
    for lock in ("requirements.lock", "requirements-dev.lock"):
        assert not pins(lock)["litellm"].startswith("1.107."), lock


def test_make_serve_installs_the_runtime_lock_and_make_test_the_dev_lock():
    make = (REPO / "Makefile").read_text()
    assert "pip install --quiet --require-hashes -r requirements.lock" in make
    assert "pip install --quiet --require-hashes -r requirements-dev.lock" in make
    # pip itself is pinned and installed before either lock (an old pip misreads extras).
    assert "pip install --quiet --require-hashes -r requirements-pip.lock" in make
    assert re.search(r"^\$\(RUNTIME\): requirements.lock pyproject.toml \$\(PIP\)$", make, re.M)
    assert re.search(r"^\$\(DEV\): requirements-dev.lock pyproject.toml \$\(PIP\)$", make, re.M)
    assert re.search(r"^serve: \$\(RUNTIME\)$", make, re.M)
    assert re.search(r"^test: \$\(DEV\) lint \$\(NODE_STAMP\)$", make, re.M)
    assert re.search(r"^lock:", make, re.M)
    assert (REPO / ".ci" / "run").read_text().strip().endswith("make test")


def test_make_test_installs_the_agent_tests_node_packages_from_their_lock():
    """The Codex CLI the agent tests drive: package-lock.json's version, by `npm ci`."""
    make = (REPO / "Makefile").read_text()
    assert re.search(r"^\$\(NODE_STAMP\): package.json package-lock.json$", make, re.M)
    assert "\tnpm ci " in make
    wanted = json.loads((REPO / "package.json").read_text())["devDependencies"]
    lock = json.loads((REPO / "package-lock.json").read_text())
    assert lock["lockfileVersion"] >= 2
    for name, version in wanted.items():
        # Exact pins only: a range would let a new release in through `npm install`.
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), (name, version)
        locked = lock["packages"][f"node_modules/{name}"]
        assert locked["version"] == version and locked["integrity"].startswith("sha512-")
    assert "/node_modules/" in (REPO / ".gitignore").read_text().splitlines()


def test_the_dockerfile_installs_the_runtime_lock_and_keeps_the_store_on_its_volume():
    docker = (REPO / "Dockerfile").read_text()
    assert "pip install --require-hashes -r requirements-pip.lock" in docker
    assert "pip install --require-hashes -r requirements.lock" in docker
    assert "pip install --no-deps ." in docker
    # Its sed points the example's relative store.path at the volume: the line must exist.
    assert "path: ./data/ctxproxy.db" in (REPO / "config.example.yaml").read_text()
    assert 'VOLUME ["/app/data"]' in docker
