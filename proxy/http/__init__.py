"""Who is talking and where it goes: body reads, JSON, headers, routing, sessions.

May import: proxy.errors, proxy.config, proxy.telemetry, proxy.store.base.
"""
