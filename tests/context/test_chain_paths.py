"""proxy/context/chain_paths.py: a session's path hashes, the resent prefix not hashed again."""

from __future__ import annotations

import pytest

from proxy.context import chain_paths
from proxy.context.chain_paths import ChainPaths
from proxy.store.base import SessionRef, chain_path_hashes

A, B = SessionRef("t", "a"), SessionRef("t", "b")


@pytest.mark.parametrize(
    "histories",
    [
        ["abc", "abcde", "abcdefg"],  # each request the last one and more
        ["abcdef", "abXdef", "ab"],  # a branch, then a shorter one
        ["abc", "abc", "", "xyz"],  # the same, nothing, another
    ],
)
def test_path_hashes_are_the_chains_whatever_came_before(histories: list[str]) -> None:
    chains = ChainPaths()
    for history in histories:
        hashes = [c * 8 for c in history]
        assert chains.of(A, hashes) == chain_path_hashes(hashes)
        assert chains.of(B, hashes[::-1]) == chain_path_hashes(hashes[::-1])


def test_only_what_follows_the_resent_prefix_is_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    chains = ChainPaths()
    chains.of(A, ["h1", "h2", "h3"])
    hashed: list[str] = []
    real = chain_paths.path_hash

    def counted(parent: str | None, content_hash: str) -> str:
        hashed.append(content_hash)
        return real(parent, content_hash)

    monkeypatch.setattr(chain_paths, "path_hash", counted)
    paths = chains.of(A, ["h1", "h2", "h3", "h4", "h5"])
    assert hashed == ["h4", "h5"]
    paths.append("changed by the caller")  # a new list each time: the memo is unchanged
    assert chains.of(A, ["h1", "h2", "h3", "h4", "h5"]) == chain_path_hashes(
        ["h1", "h2", "h3", "h4", "h5"]
    )
    assert hashed == ["h4", "h5"]
