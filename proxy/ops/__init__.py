"""What operators call: the admin API and its views, preview, expiry, reload, the CLI,
offline replay.

May import anything below it; nothing imports ops but the app and __main__.
"""
