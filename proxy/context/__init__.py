"""What reaches the model: the rewriter, tokens, model info, calibration, the message
cache, summaries and the summarizer.

May import: proxy.errors, proxy.config, proxy.telemetry, proxy.store.base,
proxy.upstream (the summarizer calls one), proxy.http.sessions (message identity),
proxy.http.resent_body (a resent body read from where the last one's messages ended),
proxy.coordination.base (summary single-flight across instances),
proxy.background, proxy.heap (malloc_trim) and policies. Never chat, responses or ops.
"""
