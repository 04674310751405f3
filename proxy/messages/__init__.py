"""The Anthropic Messages door: POST /v1/messages (pipeline, over the chat pipeline),
its content blocks as the shared chat model and back (view), its stream read on the side
(stream), the proxy's cache breakpoint (cache_marks), the litellm translation for
upstreams that do not speak it (bridge), POST /v1/messages/count_tokens (count), and
Anthropic's compaction answered by the proxy (compaction, compaction_wire).

May import: everything chat may, and proxy.chat (the door runs the chat pipeline).
Imported by the app and ops.
"""
