"""Which route serves a request: first match on path, model glob and headers."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fnmatch import translate

from proxy.config.model import Config, RouteConfig
from proxy.errors import NotFound
from proxy.http.session_lookup import header_text

# A compiled glob: fnmatchcase's semantics, without its per-call cache lookup.
Glob = Callable[[str], object]


def _glob(pattern: str) -> Glob:
    return re.compile(translate(pattern)).match


class _Compiled:
    """One route's match globs, compiled once per config."""

    def __init__(self, route: RouteConfig) -> None:
        self.route = route
        self.path = _glob(route.match.path)
        self.model = None if route.match.model is None else _glob(route.match.model)
        self.headers = [(n.lower(), _glob(p)) for n, p in route.match.headers.items()]


# Matches remembered (path, model and the header values routes look at): client
# input, so bounded; past the bound the memo starts again.
_MEMO_ENTRIES = 1024


class Router:
    def __init__(self, config: Config) -> None:
        self._routes = [_Compiled(route) for route in config.routes]
        # The only header names any route matches on: a match depends on nothing else.
        self._names = tuple(sorted({name for r in self._routes for name, _ in r.headers}))
        self._memo: dict[tuple[str | None, ...], RouteConfig] = {}

    def match(self, path: str, model: str | None, headers: Mapping[str, str]) -> RouteConfig:
        key = (path, model, *[headers.get(name) for name in self._names])
        route = self._memo.get(key)
        if route is None:
            route = self._match(path, model, headers)
            if len(self._memo) >= _MEMO_ENTRIES:
                self._memo.clear()
            self._memo[key] = route
        return route

    def _match(self, path: str, model: str | None, headers: Mapping[str, str]) -> RouteConfig:
        for r in self._routes:
            if r.path(path) is None:
                continue
            if r.model is not None and (model is None or r.model(model) is None):
                continue
            if any(glob(header_text(headers.get(name, ""))) is None for name, glob in r.headers):
                continue
            return r.route
        raise NotFound(
            f"No route is configured for {path} with model {model!r}.",
            param="model",
            code="route_not_found",
        )

    def needs_model(self, path: str) -> bool:
        """Whether a route for this path matches on the model (so the body must be read first)."""
        return any(r.model is not None and r.path(path) is not None for r in self._routes)

    def for_path(self, path: str) -> RouteConfig | None:
        """The first route whose path matches, whatever its model (for GET endpoints)."""
        for r in self._routes:
            if r.path(path) is not None:
                return r.route
        return None
