"""POST /v1/chat/completions: the pipeline (pipeline.py), the exchange's state and headers
(state.py), the relay (relay.py), its ending and record (finish.py, record.py), the policy,
cache and recall steps, and the stream assembly.

May import: everything below it (errors, config, telemetry, store, upstream, http,
context) and proxy.runtime. Imported by responses (which reuses the pipeline) and ops.
"""
