"""Storage: the Store protocol (base), the chain cache every store keeps (history_cache),
SQLite (sqlite, its writer and migrations),
Redis (redis, its scripts, queries and codec), the in-memory fake (memory).

May import: proxy.errors, proxy.telemetry and policies.types; never config or anything above.
"""
