"""POST /v1/chat/completions: the pipeline, its policy step and its stream assembly.

May import: everything below it (errors, config, telemetry, store, upstream, http,
context) and proxy.runtime. Imported by responses (which reuses the pipeline) and ops.
"""
