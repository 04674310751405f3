"""Logging (structlog) and metrics (a small Prometheus registry).

Imported by everything; imports nothing of ours but proxy.errors.
"""
