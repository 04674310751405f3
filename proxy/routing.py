"""Which route serves a request: first match on path, model glob and headers."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from proxy.config import Config, RouteConfig
from proxy.errors import NotFound


class Router:
    def __init__(self, config: Config) -> None:
        self._routes = config.routes

    def match(self, path: str, model: str | None, headers: Mapping[str, str]) -> RouteConfig:
        for route in self._routes:
            m = route.match
            if not fnmatchcase(path, m.path):
                continue
            if m.model is not None and (model is None or not fnmatchcase(model, m.model)):
                continue
            if any(
                not fnmatchcase(headers.get(name.lower(), ""), pattern)
                for name, pattern in m.headers.items()
            ):
                continue
            return route
        raise NotFound(
            f"No route is configured for {path} with model {model!r}.",
            param="model",
            code="route_not_found",
        )

    def for_path(self, path: str) -> RouteConfig | None:
        """The first route whose path matches, whatever its model (for GET endpoints)."""
        for route in self._routes:
            if fnmatchcase(path, route.match.path):
                return route
        return None
