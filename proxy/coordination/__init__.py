"""How instances that share a store agree: per-session locks with a lease and a fencing
token, summary single-flight, shared calibration factors (base: the protocols; local:
one process, the default; redis*: several instances through Redis).

May import: proxy.errors, proxy.config, proxy.telemetry, proxy.store.base, proxy.http.sessions and
proxy.context.calibration. Never chat, responses or ops.
"""
