"""Every other ``/v1/...`` endpoint: relayed unchanged (relay), and ``/v1/models`` merged (models).

No context management and nothing stored here: bodies go upstream as they came
(JSON buffered within the body limit, multipart and binary bodies streamed), and
answers come back as they arrive (SSE included), status and headers relayed.

May import: proxy.errors, proxy.config, proxy.telemetry, proxy.http, proxy.upstream,
proxy.context.model_info (context windows in Anthropic's model list) and proxy.runtime.
Imported by proxy.app.
"""
