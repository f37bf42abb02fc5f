"""A fast check that the Hugging Face hub can be reached, before ``datasets`` spends tens of seconds
of retries: one TCP connection, its timeout covering the DNS lookup too.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0


def offline_mode() -> bool:
    """True when the user asked the Hugging Face libraries to stay offline."""
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def check_hub_reachable(name: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ConnectionError when ``name`` needs the hub and its endpoint cannot be reached (local
    directories and offline mode are not probed)."""
    if Path(name).expanduser().is_dir() or offline_mode():
        return
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(e)

    # getaddrinfo ignores socket timeouts; a daemon thread bounds the lookup as well.
    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout_s + 0.5)
    if not outcome:
        raise ConnectionError(f"no answer from {host}:{port} within {timeout_s:g} s")
    if outcome[0] is not None:
        raise ConnectionError(f"cannot connect to {host}:{port} ({outcome[0]})")
