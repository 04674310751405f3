"""Context-rewriting policies: pure, synchronous functions over message lists.

Nothing here does I/O, reads a clock, logs, or imports from ``proxy``. A token
counter is handed in as a plain callable so this package never imports a
tokenizer.
"""
