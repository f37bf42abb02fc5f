"""Small pieces every package shares: user-facing errors, atomic file writes, signals, threads. This
file imports nothing, so that the entry scripts can reach ``common.signals`` before anything slow loads."""
