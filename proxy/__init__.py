"""ctxproxy: an OpenAI-compatible reverse proxy that manages conversation context."""
