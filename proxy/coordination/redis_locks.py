"""Per-session locks in Redis: a lease, renewed while held, and a fencing token.

Two levels. In the instance, requests on one session queue on an asyncio
lock (proxy/http/sessions.py), so only one of them talks to Redis at a time.
Across instances, the holder owns ``<prefix>:lock:<session digest>`` (``SET
NX PX lease``), renewed every third of the lease while the request runs; a
crashed instance stops renewing and its lock expires after at most one lease.
Waiters poll with a short backoff (2 to 50 ms); there is one poller per
instance and session, so Redis sees little of it.

The fencing token comes with the lock, made by the same script: Redis's
clock in microseconds, or the session's last token + 1 if that is larger. It
grows with every acquisition, and keeps growing across a Redis restart that
lost every key (a plain INCR counter would start again at 1, and the store
would then refuse every write of sessions it knew).

With a shared store (PostgreSQL, Redis), the new token is handed to it (``fence``) before the
holder reads anything, so from then on the store refuses writes with older
tokens: a holder whose lease lapsed (an event loop stalled past two thirds of
the lease) cannot write after the next holder began, whichever writes first.

On a Redis error while acquiring: ``CoordinationUnavailable`` (503), the
request is refused before anything is read or sent. On one while renewing or
releasing: logged; the lock expires on its own, and the store's fence check
keeps a late writer from overwriting a newer one.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from proxy.coordination.base import CoordinationUnavailable, FenceHook, SessionLockTimeout
from proxy.http.sessions import SessionLocks as LocalLocks
from proxy.store.base import SessionRef
from proxy.telemetry.logging import get_logger

log = get_logger()

_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local last = tonumber(redis.call('GET', KEYS[2]) or '0')
    local token = math.max(now, last + 1)
    redis.call('SET', KEYS[2], string.format('%d', token), 'PX', ARGV[3])
    return token
end
return false
"""

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""

# The last token is kept this long after a session's last lock (then the clock takes over).
_FENCE_TTL_MS = 30 * 86400 * 1000
_POLL_FIRST_S, _POLL_MAX_S = 0.002, 0.05


def session_digest(ref: SessionRef) -> str:
    """A bounded, safe key part for any client-chosen (tenant, session key)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(ref.tenant.encode())
    h.update(b"\0")
    h.update(ref.key.encode())
    return h.hexdigest()


@dataclass
class _Held:
    key: str
    owner: str
    token: int
    renewer: asyncio.Task[None]


class RedisSessionLocks:
    def __init__(
        self,
        client: Redis,
        prefix: str,
        *,
        lease_s: float,
        wait_s: float,
        instance: str,
        fence: FenceHook | None = None,
    ) -> None:
        self._fence = fence
        self._client = client
        self._prefix = prefix
        self.lease_s = lease_s
        self.wait_s = wait_s
        self._instance = instance
        self._local = LocalLocks()
        self._held: dict[SessionRef, _Held] = {}
        self._releasing: set[asyncio.Task[None]] = set()
        self._acquire = client.register_script(_ACQUIRE)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(RELEASE)

    def keys(self, ref: SessionRef) -> tuple[str, str]:
        digest = session_digest(ref)
        return f"{self._prefix}:lock:{digest}", f"{self._prefix}:fence:{digest}"

    async def acquire(self, ref: SessionRef) -> int:
        await self._local.acquire(ref)
        try:
            held = await self._acquire_remote(ref)
        except BaseException:
            self._local.release(ref)
            raise
        self._held[ref] = held
        if self._fence is not None:
            try:
                # Before the holder reads: a lapsed holder's late write is refused.
                await self._fence(ref, held.token)
            except BaseException:
                self.release(ref)
                raise
        return held.token

    async def _acquire_remote(self, ref: SessionRef) -> _Held:
        key, fence = self.keys(ref)
        owner = f"{self._instance}:{uuid.uuid4().hex}"
        lease_ms = int(self.lease_s * 1000)
        deadline = time.monotonic() + self.wait_s
        delay = _POLL_FIRST_S
        while True:
            try:
                token = await self._acquire(
                    keys=[key, fence], args=[owner, lease_ms, _FENCE_TTL_MS]
                )
            except (RedisError, OSError) as exc:
                log.warning("coordination_unavailable", op="lock", error=repr(exc))
                raise CoordinationUnavailable(
                    "The proxy cannot reach its coordination service (Redis), so it cannot "
                    "serialize this session's history: retry shortly."
                ) from exc
            if token:
                break
            if time.monotonic() >= deadline:
                raise SessionLockTimeout(
                    f"The session stayed busy for {self.wait_s:g}s (another request holds it)."
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _POLL_MAX_S)
        renewer = asyncio.get_running_loop().create_task(
            self._keep(key, owner), name="session-lock-renew"
        )
        return _Held(key, owner, int(token), renewer)

    async def _keep(self, key: str, owner: str) -> None:
        """Renew the lease every third of it while the lock is held."""
        lease_ms = int(self.lease_s * 1000)
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                kept = await self._renew(keys=[key], args=[owner, lease_ms])
            except (RedisError, OSError) as exc:
                log.warning("session_lock_renew_failed", error=repr(exc))
                continue
            if not kept:
                # Expired and maybe taken: the fence keeps this holder's write out.
                log.warning("session_lock_lost", key=key)
                return

    def release(self, ref: SessionRef) -> None:
        held = self._held.pop(ref, None)
        if held is None:
            self._local.release(ref)
            return
        held.renewer.cancel()
        task = asyncio.get_running_loop().create_task(self._release_remote(ref, held))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _release_remote(self, ref: SessionRef, held: _Held) -> None:
        try:
            await self._release(keys=[held.key], args=[held.owner])
        except (RedisError, OSError) as exc:
            log.warning("session_lock_release_failed", error=repr(exc))
        finally:
            # Only now may the next local request try: the key is gone, its SET NX wins.
            self._local.release(ref)

    async def close(self) -> None:
        for held in self._held.values():
            held.renewer.cancel()
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
