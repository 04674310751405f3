"""Upstream seam: forward a request, relay the answer."""

from proxy.upstream.base import Upstream, UpstreamRequest, UpstreamResponse

__all__ = ["Upstream", "UpstreamRequest", "UpstreamResponse"]
