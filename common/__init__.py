"""Small pieces every package shares: user-facing errors, atomic file writes, signals, threads.

Import the module you need (``common.files``, ``common.errors``, ...): this file imports nothing, so
that the entry scripts can reach ``common.signals`` before anything slow has loaded.
"""
