"""The objects a running proxy shares between requests, built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.background import Background
from proxy.config import Config, UpstreamConfig
from proxy.rewriter import Rewriter
from proxy.routing import Router
from proxy.sessions import SessionLocks
from proxy.store.base import Store
from proxy.upstream.base import Upstream


def build_upstream(config: UpstreamConfig) -> Upstream:
    if config.base_url is not None:
        from proxy.upstream.openai_compat import OpenAICompatUpstream

        return OpenAICompatUpstream(
            config.base_url,
            timeout_s=config.timeout_s,
            connect_timeout_s=config.connect_timeout_s,
        )
    from proxy.upstream.provider import LitellmUpstream

    assert config.litellm_model is not None  # config guarantees one of the two
    return LitellmUpstream(
        config.litellm_model,
        api_base=config.api_base,
        api_key=config.api_key,
        timeout_s=config.timeout_s,
    )


@dataclass
class Runtime:
    config: Config
    store: Store
    upstreams: dict[str, Upstream]
    router: Router = field(init=False)
    rewriter: Rewriter = field(init=False)
    locks: SessionLocks = field(default_factory=SessionLocks)
    background: Background = field(default_factory=Background)

    def __post_init__(self) -> None:
        self.router = Router(self.config)
        self.rewriter = Rewriter(self.config.policies)

    async def close(self) -> None:
        await self.background.drain()
        for upstream in self.upstreams.values():
            await upstream.close()
        await self.store.close()
