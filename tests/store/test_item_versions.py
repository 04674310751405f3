"""ItemVersions: each session's items' version, bounded by sessions (least recently committed out)."""

from __future__ import annotations

from proxy.store.base import SessionRef
from proxy.store.item_versions import SESSIONS, ItemVersions


def ref(i: int) -> SessionRef:
    return SessionRef("tenant", f"session-{i}")


def test_the_map_never_holds_more_sessions_than_its_bound():
    versions = ItemVersions(max_sessions=8)
    for i in range(100):
        versions.committed(ref(i), session_id=i, ids=[10 * i, 10 * i + 1])
        assert len(versions) <= 8
    # The newest eight are known; every older one is unknown (memoize nothing).
    assert [versions.version(ref(i)) is not None for i in range(100)] == [
        i >= 92 for i in range(100)
    ]


def test_a_session_committed_again_is_the_last_to_go():
    versions = ItemVersions(max_sessions=3)
    for i in range(3):
        versions.committed(ref(i), session_id=i, ids=[i])
    kept = versions.version(ref(0))
    # Session 0 resends its history (no new item): used, so it outlives 1 and 2.
    versions.committed(ref(0), session_id=0, ids=[0])
    versions.committed(ref(3), session_id=3, ids=[3])
    versions.committed(ref(4), session_id=4, ids=[4])
    assert versions.version(ref(0)) == kept
    assert versions.version(ref(1)) is None and versions.version(ref(2)) is None
    assert len(versions) == 3


def test_the_default_bound_is_the_memos_sessions():
    versions = ItemVersions()
    for i in range(SESSIONS + 500):
        versions.committed(ref(i), session_id=i, ids=[i])
    assert len(versions) == SESSIONS == 1024
