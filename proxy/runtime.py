"""The objects a running proxy shares between requests, built once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from proxy.background import Background
from proxy.config.model import Config, UpstreamConfig
from proxy.context.calibration import Calibration
from proxy.context.message_cache import MessageCache
from proxy.context.recall import RecallService
from proxy.context.rewriter import Rewriter
from proxy.context.server_tokens import ServerTokens
from proxy.context.stable_prefix import KEY_BYTES, StablePrefixes
from proxy.context.summaries import SummaryService
from proxy.context.tokens import set_count_budget
from proxy.context.windows import ContextWindows
from proxy.coordination.base import Coordinator
from proxy.coordination.base import SessionLocks as CoordinatedLocks
from proxy.coordination.local import LocalCoordinator
from proxy.http.history_view import HistoryViews
from proxy.http.routing import Router
from proxy.store.backends import StoreSpec, build_store
from proxy.store.base import CacheBudget, Store
from proxy.store.search_backends import items_versions_for, recall_index_for, vector_index_for
from proxy.telemetry.metrics import Metrics
from proxy.upstream.base import Upstream

if TYPE_CHECKING:
    from proxy.context.embedder import Embedder
    from proxy.context.embeddings import Embeddings


def uses_embeddings(config: Config) -> bool:
    """Whether any policy's recall asks for semantic search."""
    return any(
        getattr(getattr(spec, "recall", None), "embeddings", "none") != "none"
        for spec in config.policies.values()
    )


def build_upstream(config: UpstreamConfig) -> Upstream:
    if config.base_url is not None:
        from proxy.upstream.openai_compat import OpenAICompatUpstream

        return OpenAICompatUpstream(
            config.base_url,
            timeout_s=config.timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            name=config.name,
        )
    from proxy.upstream.provider import LitellmUpstream

    assert config.litellm_model is not None  # config guarantees one of the two
    return LitellmUpstream(
        config.litellm_model,
        api_base=config.api_base,
        api_key=config.api_key,
        timeout_s=config.timeout_s,
        name=config.name,
    )


def build_store_for(config: Config) -> Store:
    """The store the config's ``store`` section names (proxy/store/backends.py)."""
    store = config.store
    return build_store(
        StoreSpec(
            path=store.path,
            url=store.url,
            pool_size=store.pool_size,
            schema=store.schema,
            ttl_s=config.session.ttl_s,
            key_prefix=store.key_prefix,
            caches=CacheBudget(config.cache.max_bytes),
        )
    )


@dataclass
class Runtime:
    config: Config
    store: Store
    upstreams: dict[str, Upstream]
    router: Router = field(init=False)
    rewriter: Rewriter = field(init=False)
    # How this instance agrees with others on one store (in-process by default).
    coordinator: Coordinator = field(default_factory=LocalCoordinator)
    locks: CoordinatedLocks = field(init=False)
    background: Background = field(default_factory=Background)
    metrics: Metrics = field(default_factory=Metrics)
    calibration: Calibration = field(default_factory=Calibration)
    # Context windows of the models behind each upstream (config, model map, server).
    windows: ContextWindows = field(default_factory=ContextWindows)
    # A local server's own token counts, for streams that report no usage.
    server_tokens: ServerTokens = field(default_factory=ServerTokens)
    # Upstreams whose model list was asked for (once each; see Calibration.serves).
    models_asked: set[str] = field(default_factory=set)
    # Each session's last messages, hashed and counted (a resent history is not done again).
    messages: MessageCache = field(default_factory=MessageCache)
    # Each session's stored chain as checked and counted last (history: server).
    history_views: HistoryViews = field(default_factory=HistoryViews)
    # Each session's last forwarded list, for X-Context-Stable-Prefix.
    prefixes: StablePrefixes = field(default_factory=StablePrefixes)
    # Summaries made, awaited and prefetched; shared by every pinned view.
    summaries: SummaryService = field(init=False)
    # Evicted turns brought back (policies with a ``recall:`` block).
    recall: RecallService = field(init=False)
    # The embedder for ``embeddings: wordllama`` (None: the real one; tests pass a fake).
    embedder: Embedder | None = None
    # Bumped by every reload. A pinned view keeps the generation it was made in.
    generation: int = field(default=0, init=False)
    # Shared by the runtime and its pinned views (never reassigned, only mutated):
    # requests in flight per generation, and upstreams a reload replaced, with
    # the generation they last served.
    _inflight: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _retired: list[tuple[int, Upstream]] = field(default_factory=list, init=False, repr=False)
    _pinned: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        # cache.max_bytes, shared out (proxy.store.base.CacheBudget); the store took its shares.
        budget = CacheBudget(self.config.cache.max_bytes)
        self.messages.max_bytes = budget.messages
        self.prefixes.max_keys = max(1, budget.prefixes // KEY_BYTES)
        set_count_budget(budget.counts)
        self.router = Router(self.config)
        self.windows.upstreams = self.config.upstreams
        self.rewriter = Rewriter(self.config.policies, self.calibration.factor, self.windows.window)
        self.calibration.register(self.metrics.registry)
        self.locks = self.coordinator.locks
        self.summaries = SummaryService(
            self.store, self.background, self.metrics, flights=self.coordinator.flights
        )
        self.recall = RecallService(
            recall_index_for(self.store),
            self.metrics,
            embeddings=self._embeddings(),
            versions=items_versions_for(self.store),
        )
        self.recall.memo.max_bytes = budget.recall_memo
        self.summaries.memo.max_bytes = budget.plan_memo
        if self.summaries.chains is not None:
            self.summaries.chains.max_bytes = budget.path_hashes

    def _embeddings(self) -> Embeddings | None:
        """Semantic recall's parts, when a policy asks for it and the store keeps vectors.

        Imported here: numpy and the model are loaded only by configs that use them.
        """
        if not uses_embeddings(self.config):
            return None
        index = vector_index_for(self.store)
        if index is None:
            return None
        from proxy.context.embedder import WordLlamaEmbedder
        from proxy.context.embeddings import Embeddings

        embedder = self.embedder if self.embedder is not None else WordLlamaEmbedder()
        return Embeddings(embedder, index, self.background, self.metrics)

    def start_embeddings(self) -> None:
        """Load the embedding model in the background, if a policy needs it (start, reload)."""
        if self.recall.embeddings is None:
            self.recall.embeddings = self._embeddings()
        if self.recall.embeddings is not None:
            self.recall.embeddings.start()

    def pin(self) -> Runtime:
        """A view of the runtime as it is now, for one request.

        Config, router, rewriter and upstreams stay those of this moment for
        the whole request, even if a reload swaps them meanwhile (the route it
        matched may name a policy or upstream the new config no longer has).
        Call ``release`` on the view when the request no longer needs them.
        """
        # A shallow copy, without copy.copy's generic (and slower) protocol.
        view = object.__new__(type(self))
        view.__dict__.update(self.__dict__)
        view._pinned = True
        self._inflight[self.generation] = self._inflight.get(self.generation, 0) + 1
        return view

    @property
    def in_flight(self) -> int:
        """Pinned requests not yet released (a request is released once it is recorded)."""
        return sum(self._inflight.values())

    def release(self) -> None:
        """The pinned request is done with its upstream; safe to call twice."""
        if not self._pinned:
            return
        self._pinned = False
        left = self._inflight[self.generation] - 1
        if left:
            self._inflight[self.generation] = left
        else:
            del self._inflight[self.generation]
        self._close_retired()

    def reload(self, config: Config) -> list[str]:
        """Swap in a new (already validated) config; return the sections needing a restart.

        Upstreams whose config did not change are kept with their connection
        pools; the others are closed once the requests that may use them end.
        ``server`` and ``store`` cannot change under a running server: their
        old values stay in force.
        """
        restart = [
            s
            for s in ("server", "store", "coordination", "cache")
            if getattr(config, s) != getattr(self.config, s)
        ]
        config = replace(
            config,
            server=self.config.server,
            store=self.config.store,
            coordination=self.config.coordination,
            cache=self.config.cache,
        )
        upstreams: dict[str, Upstream] = {}
        for name, upstream_config in config.upstreams.items():
            same = self.config.upstreams.get(name) == upstream_config and name in self.upstreams
            upstreams[name] = self.upstreams[name] if same else build_upstream(upstream_config)
        kept = {id(u) for u in upstreams.values()}
        self._retired.extend(
            (self.generation, u) for u in self.upstreams.values() if id(u) not in kept
        )
        self.config = config
        self.router = Router(config)
        self.windows.upstreams = config.upstreams
        self.rewriter = Rewriter(config.policies, self.calibration.factor, self.windows.window)
        self.upstreams = upstreams
        self.start_embeddings()
        self.generation += 1
        self._close_retired()
        return restart

    def _close_retired(self) -> None:
        oldest = min(self._inflight, default=self.generation + 1)
        done = [u for generation, u in self._retired if generation < oldest]
        if not done:
            return
        self._retired[:] = [(g, u) for g, u in self._retired if g >= oldest]
        for upstream in done:
            self.background.spawn(upstream.close(), name="close-retired-upstream")

    async def close(self) -> None:
        await self.background.drain()
        for upstream in [*self.upstreams.values(), *(u for _, u in self._retired)]:
            await upstream.close()
        self._retired.clear()
        await self.coordinator.close()
        await self.store.close()
