"""POST /v1/responses and the stored responses: items, the chain a response continues,
replay, stream, the chat bridge.

May import: everything chat may, and proxy.chat (the Responses pipeline is the chat
pipeline over items). Imported by ops (preview) and the app.
"""
