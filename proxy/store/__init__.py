"""Storage seam: a small protocol with a SQLite backend and an in-memory fake."""

from proxy.store.base import (
    ExchangeResult,
    MessageIn,
    RequestRecord,
    SessionInfo,
    SessionRef,
    Store,
    StoredItem,
)

__all__ = [
    "ExchangeResult",
    "MessageIn",
    "RequestRecord",
    "SessionInfo",
    "SessionRef",
    "Store",
    "StoredItem",
]
