"""Who is talking and where it goes: body reads, JSON (resent_body.py: a long resent body
read from where its last one ended), headers, routing, sessions, and the
checks of what a request replays (shape.py; history_view.py: a stored chain, new items only).

May import: proxy.errors, proxy.config, proxy.telemetry, proxy.store.base.
"""
