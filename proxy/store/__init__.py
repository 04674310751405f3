"""Storage: the Store protocol (base), SQLite (sqlite, its writer and migrations),
the in-memory fake (memory).

May import: proxy.errors, proxy.telemetry and policies.types; never config or anything above.
"""
