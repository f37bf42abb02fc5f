"""One line per request on the ``serving.access`` logger: client, method, path, status, tokens in
and out, and time. It wraps the whole app, so a refusal or a bug is logged as surely as a reply."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Receive, Scope, Send

access_log = logging.getLogger("serving.access")


class AccessLog:
    """ASGI middleware. A route that answers with a reply leaves it in the request's state as
    ``reply``; its ``prompt_tokens`` and ``completion_tokens`` are read when the request ends."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500  # 500 unless a response starts
        state = scope.setdefault("state", {})

        async def send_and_note(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            reply = state.get("reply")
            tokens = f"in={reply.prompt_tokens} out={reply.completion_tokens}" if reply else "in=- out=-"
            client = scope["client"][0] if scope.get("client") else "-"
            access_log.info("%s %s %s %d %s %.3fs", client, scope["method"], scope["path"], status, tokens,
                            time.perf_counter() - start)
