"""Which coordinator a config names: in-process by default, Redis with a ``redis_url``."""

from __future__ import annotations

from proxy.config.model import CoordinationConfig
from proxy.context.calibration import Calibration
from proxy.coordination.base import Coordinator, FenceHook
from proxy.coordination.local import LocalCoordinator


def build_coordinator(
    config: CoordinationConfig, calibration: Calibration, *, fence: FenceHook | None = None
) -> Coordinator:
    """``fence``: the store's ``advance_fence`` if it checks fencing tokens (PostgreSQL, Redis)."""
    if config.redis_url is None:
        return LocalCoordinator()
    from proxy.coordination.redis import RedisCoordinator

    return RedisCoordinator(
        config.redis_url,
        prefix=config.key_prefix,
        lease_s=config.lock_lease_s,
        wait_s=config.lock_wait_s,
        calibration=calibration,
        fence=fence,
    )
