"""SIGHUP reloads the config file: validated first, swapped in only if valid.

An invalid file is rejected with an error log line and the running config
stays in force. A valid one replaces routes, policies, upstreams, the admin
key, session settings and logging; ``server`` and ``store`` need a restart
(see ``Runtime.reload``). Requests already in flight finish under the config
they started with.
"""

from __future__ import annotations

import asyncio
import signal

from proxy.config.loader import load_config
from proxy.config.model import Config
from proxy.context.model_info import context_window
from proxy.context.rewriter import Rewriter
from proxy.errors import ConfigError, ConfigErrors
from proxy.runtime import Runtime
from proxy.telemetry.logging import configure_logging, get_logger

log = get_logger()


class Reloader:
    def __init__(self, runtime: Runtime, path: str | None) -> None:
        self.runtime = runtime
        self.path = path
        # Two quick SIGHUPs must not apply their files out of order.
        self._lock = asyncio.Lock()
        self._installed = False

    async def reload(self) -> bool:
        """Load, validate and apply the config file; False when it was rejected."""
        async with self._lock:
            if self.path is None:
                log.warning("config_reload_skipped", reason="the config was not read from a file")
                return False
            try:
                config = await asyncio.to_thread(load_config, self.path)
            except ConfigError as exc:
                self.runtime.metrics.reloads.inc(("rejected",))
                problems = exc.errors if isinstance(exc, ConfigErrors) else [exc]
                log.error(
                    "config_reload_rejected",
                    path=self.path,
                    error=str(exc),
                    problems=[str(p) for p in problems],
                )
                return False
            await self._apply(config)
            return True

    async def _apply(self, config: Config) -> None:
        rt = self.runtime
        old_logging = rt.config.logging
        if Rewriter(config.policies).needs_model_info():
            # Import litellm's model map now, off the event loop, not on a request.
            await asyncio.to_thread(context_window, "gpt-4o")
        restart = rt.reload(config)
        if config.logging != old_logging:
            configure_logging(config.logging.level, config.logging.format)
        rt.metrics.reloads.inc(("ok",))
        log.info(
            "config_reloaded",
            path=self.path,
            generation=rt.generation,
            routes=len(config.routes),
            policies=len(config.policies),
            upstreams=len(config.upstreams),
        )
        if restart:
            log.warning("config_reload_needs_restart", sections=restart)

    def _on_signal(self) -> None:
        self.runtime.background.spawn(self.reload(), name="config-reload")

    def install(self) -> bool:
        """Reload on SIGHUP; False where signals cannot be handled (not the main thread)."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._on_signal)
        except (ValueError, RuntimeError, NotImplementedError, AttributeError) as exc:
            # Only the main thread may set signal handlers (tests run the app in
            # another one); Windows has no SIGHUP.
            log.debug("sighup_not_installed", reason=repr(exc))
            return False
        self._installed = True
        return True

    def uninstall(self) -> None:
        if self._installed:
            self._installed = False
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
