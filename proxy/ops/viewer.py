"""`GET /admin/ui`: the session viewer, three static files shipped inside the package.

The page holds no data: it asks for the admin key once, keeps it in the
tab's ``sessionStorage`` and reads the admin API with it, so serving the
files needs no key (a browser cannot send one on navigation). It is served
only when the admin API is enabled; otherwise the answer is the admin API's
401. The files are read once, at import, from ``proxy/ops/static/`` (package
data, so a non-editable install has them); no build step, no CDN, nothing
fetched from elsewhere, which the Content-Security-Policy enforces too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib.resources import files

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from proxy.errors import NotFound, Unauthorized
from proxy.http.body import error_response
from proxy.runtime import Runtime

# Everything the page loads comes from this origin; no inline script or style,
# no frames, no forms posted anywhere: a message that slipped past the page's
# escaping still could not run.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str
    etag: str


def _asset(name: str, media_type: str) -> Asset:
    body = (files("proxy.ops") / "static" / name).read_bytes()
    return Asset(body, media_type, '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"')


ASSETS = {
    "": _asset("viewer.html", "text/html; charset=utf-8"),
    "viewer.css": _asset("viewer.css", "text/css; charset=utf-8"),
    "viewer.js": _asset("viewer.js", "text/javascript; charset=utf-8"),
}


def page_bytes() -> int:
    """The page's size: HTML, CSS and JS together."""
    return sum(len(asset.body) for asset in ASSETS.values())


def _headers(asset: Asset) -> dict[str, str]:
    return {
        "content-security-policy": CSP,
        "x-content-type-options": "nosniff",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
        # Revalidated on every load, so an upgraded proxy never runs a stale script.
        "cache-control": "no-cache",
        "etag": asset.etag,
    }


async def _serve(request: Request) -> Response:
    rt: Runtime = request.app.state.runtime
    if rt.config.admin.api_key is None:
        error = Unauthorized(
            "The admin API is disabled: set admin.api_key (an os.environ/NAME reference).",
            code="admin_disabled",
        )
        return error_response(error, {"www-authenticate": 'Bearer realm="ctxproxy-admin"'})
    asset = ASSETS.get(request.path_params.get("name", ""))
    if asset is None:
        return error_response(NotFound(f"No such file: {request.url.path}"))
    headers = _headers(asset)
    if request.headers.get("if-none-match") == asset.etag:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


async def _slash(request: Request) -> Response:
    # The page's URLs are relative to /admin/ui (so a path prefix in front of the proxy works).
    return RedirectResponse("../ui", status_code=308)


ROUTES = [
    Route("/admin/ui", _serve, methods=["GET", "HEAD"]),
    Route("/admin/ui/", _slash, methods=["GET", "HEAD"]),
    Route("/admin/ui/{name}", _serve, methods=["GET", "HEAD"]),
]
