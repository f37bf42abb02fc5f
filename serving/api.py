"""The HTTP layer: OpenAI requests become engine requests, engine events become JSON or SSE.

Routes: ``GET /`` (the chat page, ``chat.html``), ``GET /health``, ``GET /v1/models``,
``POST /v1/completions``, ``POST /v1/chat/completions``. Every refusal is an OpenAI error body with a 4xx status (an unknown route or method and an
over-size body included), and the server goes on serving. Text streams as Server-Sent Events, one
chunk per piece of whole characters, ending ``data: [DONE]``. A chat longer than the model's window
is cut by the chat format's policy (``data.chat.fit_for_reply``: the oldest whole messages go, the
system prompt stays) and answered; the ``X-Dropped-Messages`` header of every chat response says
how many were left out, and the reply ends where the window is full. A client that goes away mid-request
cancels it, streaming or not, which frees its row in the engine. Each request ends with one line on
the ``serving.access`` logger: method, path, status, tokens in and out, and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from data.chat import ChatTokenIds, ChatTooLong, fit_for_reply, to_messages
from data.errors import DataError
from inference.completion import encode_prompt
from model.generation import SamplingSettings
from rundir.loading import LoadedRun
from inference.engine import Engine, EngineBusy, Event, Finish, Ticket
from serving.logprobs import ReplyLogprobs
from serving.schemas import (Body, ChatCompletionRequest, CompletionRequest, RequestError, ServerRules, _Common,
                             error_body, parse_request)

# How long an overloaded server asks clients to wait before trying again (seconds).
RETRY_AFTER_S = 1

access_log = logging.getLogger("serving.access")


@dataclass(frozen=True)
class Limits:
    max_tokens_cap: int = 2048  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when a request gives none (at most the cap)
    # The largest request body read. A prompt fills the context long before this, even with every
    # character JSON-escaped; a bigger body only costs memory.
    max_body_bytes: int = 2**20
    # How long the rest of an over-size body is read and dropped before the 413 is sent anyway (and
    # the connection closed).
    discard_s: float = 30.0


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind, self.headers = status, param, code, kind, headers


class _Service:
    """What the routes share: the run, the engine, the limits, and the chat token ids (if any)."""

    def __init__(self, run: LoadedRun, engine: Engine, limits: Limits, model_id: str) -> None:
        self.run, self.engine, self.limits, self.model_id = run, engine, limits, model_id
        self.rules = ServerRules(model_id, len(run.token_bytes), limits.max_tokens_cap, limits.default_max_tokens)
        self.created = int(time.time())
        try:
            self.chat_ids: ChatTokenIds | None = ChatTokenIds.of(run.tokenizer)
            self.no_chat_reason = ""
        except DataError as error:
            self.chat_ids, self.no_chat_reason = None, str(error)
        # A token stands for at most this many characters, so a longer text cannot fit the context:
        # refused before the tokenizer spends time on it.
        self.max_prompt_chars = run.block_size * max(len(b) for b in run.token_bytes)

    async def read(self, request: Request, schema: type[Body]) -> Body:
        """The request's body as ``schema``; refused with 413 past ``max_body_bytes``, keeping no
        more than that (whether or not the client declared a Content-Length)."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        over = declared.isdigit() and int(declared) > limit
        stream, raw, ended = request.stream(), bytearray(), True
        try:
            if not over:
                async for chunk in stream:
                    raw += chunk
                    if len(raw) > limit:
                        over = True
                        break
            if over:
                ended = await _drop_rest(stream, self.limits.discard_s)
        except ClientDisconnect:
            raise ApiError(499, "the client closed the connection") from None
        if over:
            raise ApiError(413, f"the request body is over this server's limit of {limit} bytes "
                           "(serve.py --max-body-bytes); send a shorter one", code="request_too_large",
                           headers=None if ended else {"Connection": "close"})
        try:
            return parse_request(bytes(raw), schema, self.rules)
        except RequestError as error:
            raise ApiError(error.status, str(error), param=error.param, code=error.code) from None

    def check_length(self, chars: int, tokens: int | None, param: str) -> None:
        block = self.run.block_size
        if chars > self.max_prompt_chars or (tokens is not None and tokens > block):
            size = f"{tokens} tokens" if tokens is not None else f"{chars} characters"
            raise ApiError(400, f"the {param} is {size}, more than this model's context of {block} "
                           f"tokens; shorten it", param=param, code="context_length_exceeded")

    def completion_prompt(self, prompt: str | list[int]) -> tuple[list[int], str]:
        """A completion request's prompt (text, or token ids the schema has checked) as token ids,
        and as text (what echo returns)."""
        if isinstance(prompt, str):
            self.check_length(len(prompt), None, "prompt")
            encoded = encode_prompt(self.run, prompt)
            self.check_length(len(prompt), encoded.original_length, "prompt")
            return encoded.ids, prompt
        self.check_length(0, len(prompt), "prompt")
        return list(prompt), b"".join(self.run.token_bytes[i] for i in prompt).decode("utf-8", "replace")

    def submit(
        self, prompt_ids: list[int], params: SamplingSettings, end_ids: list[int], logprobs: int | None = None,
        echo: bool = False, slide: bool = True,
    ) -> tuple[Ticket, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def on_event(event: Event) -> None:  # called on the engine thread
            with contextlib.suppress(RuntimeError):  # the event loop has closed: shutting down
                loop.call_soon_threadsafe(queue.put_nowait, event)

        try:
            ticket = self.engine.submit(prompt_ids, params, on_event, end_ids=end_ids, logprobs=logprobs, echo=echo,
                                        slide=slide)
        except EngineBusy:
            raise ApiError(503, "the server is busy: every row and the waiting queue are full; retry "
                           "shortly", kind="server_busy", code="overloaded",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        return ticket, queue


def create_app(run: LoadedRun, engine: Engine, *, model_id: str, limits: Limits = Limits()) -> FastAPI:
    """The ASGI app. Its lifespan starts the engine's loop and stops it on shutdown."""
    service = _Service(run, engine, limits, model_id)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    page = Path(__file__).with_name("chat.html").read_text(encoding="utf-8")
    app = FastAPI(title="minigpt", lifespan=lifespan)
    app.add_middleware(_AccessLog)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error_body(str(error), kind=error.kind, param=error.param, code=error.code),
                            status_code=error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def framework_refusal(request: Request, error: HTTPException) -> JSONResponse:
        """The framework's own refusals (no such route, a method the route lacks), OpenAI-shaped."""
        where = f"{request.method} {request.url.path}"
        if error.status_code == 404:
            routes = ", ".join(f"{method} {route.path}" for route in app.routes if isinstance(route, APIRoute)
                               for method in sorted(route.methods))
            message = f"no such endpoint: {where}; this server has {routes}"
        elif error.status_code == 405:
            message = f"{where} is not allowed; {request.url.path} takes {(error.headers or {}).get('Allow', 'other methods')}"
        else:
            message = f"{where}: {error.detail}"
        return JSONResponse(error_body(message), status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def bug(_request: Request, _error: Exception) -> JSONResponse:
        # Starlette still raises the exception afterwards, so its traceback reaches the log.
        return JSONResponse(error_body("the server failed on this request (a bug: see its log)",
                                       kind="server_error"), status_code=500)

    @app.get("/", include_in_schema=False)
    async def chat_page() -> HTMLResponse:
        # The whole page, whatever Range a client sends (HTTP lets a server ignore Range): the page
        # is small and only useful whole, so it offers no ranges and never answers 206 or 416.
        return HTMLResponse(page)

    @app.get("/health")
    async def health() -> dict:
        # "chat" tells the page whether to offer a chat or a completion box.
        return {"status": "ok", "model": model_id, "active": engine.active, "waiting": engine.waiting,
                "max_batch": engine.max_batch, "chat": service.chat_ids is not None}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [
            {"id": model_id, "object": "model", "created": service.created, "owned_by": "minigpt"}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await service.read(request, CompletionRequest)
        ids, text = service.completion_prompt(body.prompt)
        params = _settings(body)
        wanted = body.logprobs is not None
        ticket, queue = service.submit(ids, params, [run.eot_id], body.logprobs, body.echo and wanted)
        logprobs = ReplyLogprobs(run.token_bytes, wanted, text, body.echo, hidden=(run.eot_id,))
        reply = _Reply("cmpl", "text_completion", model_id, ids, logprobs, echo=text if body.echo else "")
        return await _answer(request, body, reply, ticket, queue)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await service.read(request, ChatCompletionRequest)
        if service.chat_ids is None:
            raise ApiError(400, f"this run cannot chat: {service.no_chat_reason}; /v1/completions "
                           "still works", param="messages", code="chat_not_supported")
        if body.messages:  # a last message that cannot fit is refused before the tokenizer spends time on it
            service.check_length(len(body.messages[-1].content), None, "messages")
        try:
            messages = to_messages([{"role": m.role, "content": m.content} for m in body.messages])
            fitted = fit_for_reply(run.tokenizer, messages, run.block_size)
        except ChatTooLong as error:
            raise ApiError(400, str(error), param="messages", code="context_length_exceeded") from None
        except DataError as error:
            raise ApiError(400, str(error), param="messages") from None
        # The chat rule (data.chat.ChatTokenIds): role tokens never sampled, end tokens never shown.
        params = _settings(body, suppress_ids=service.chat_ids.suppress_ids)
        top = (body.top_logprobs or 0) if body.logprobs else None
        ids = fitted.chat.ids
        ticket, queue = service.submit(ids, params, list(service.chat_ids.reply_end_ids), top, slide=False)
        reply = _Reply("chatcmpl", "chat.completion", model_id, ids,
                       ReplyLogprobs(run.token_bytes, body.logprobs, chat=True, hidden=service.chat_ids.reply_end_ids),
                       headers={"X-Dropped-Messages": str(fitted.dropped)})
        return await _answer(request, body, reply, ticket, queue)

    return app


async def _drop_rest(stream: AsyncIterator[bytes], seconds: float) -> bool:
    """Read what is left of a body and drop it, for at most ``seconds``; whether it ended. Most
    clients send a whole body before they read the answer: one that asked to close the connection
    would see it reset instead of the 413 if the server closed it with the body still coming."""
    try:
        async with asyncio.timeout(seconds):
            async for _ in stream:
                pass
        return True
    except TimeoutError:
        return False


def _settings(body: _Common, suppress_ids: tuple[int, ...] = ()) -> SamplingSettings:
    return SamplingSettings(max_new_tokens=body.max_new_tokens, temperature=body.temperature, top_k=None,
                            top_p=body.top_p, seed=body.seed, stop=body.stop_strings(), suppress_ids=suppress_ids)


class _Reply:
    """One response's id and shapes, for a whole body or for its stream of chunks, and the tokens
    it has counted so far (for the access log). ``echo``: the prompt text a completion begins with."""

    def __init__(self, prefix: str, kind: str, model_id: str, prompt_ids: list[int], logprobs: ReplyLogprobs,
                 *, echo: str = "", headers: dict[str, str] | None = None) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model_id, self.chat = kind, model_id, logprobs.chat
        self.created = int(time.time())
        self.prompt_ids, self.logprobs, self.echo = prompt_ids, logprobs, echo
        self.headers = headers or {}  # sent with the response, streamed or whole
        self.prompt_tokens, self.completion_tokens = len(prompt_ids), 0

    def _envelope(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id,
                "choices": choices}

    def body(self, finish: Finish) -> dict:
        logprobs = self.logprobs.whole(self.prompt_ids, finish)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": finish.text},
                      "logprobs": logprobs, "finish_reason": finish.reason}
        else:
            choice = {"index": 0, "text": self.echo + finish.text, "logprobs": logprobs, "finish_reason": finish.reason}
        return {**self._envelope(self.kind, [choice]), "usage": _usage(finish)}

    def _chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False,
               logprobs: dict | None = None) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    async def stream(self, ticket: Ticket, queue: asyncio.Queue, include_usage: bool) -> AsyncIterator[dict]:
        try:
            if self.chat:
                yield self._chunk(None, role=True)
            if self.echo:
                yield self._chunk(self.echo)
            while True:
                event: Event = await queue.get()
                self.completion_tokens += event.token_id is not None
                logprobs = self.logprobs.chunk(event)
                if event.text or logprobs:
                    yield self._chunk(event.text, logprobs=logprobs)
                finish = event.finish
                if finish is None:
                    continue
                if finish.reason not in ("stop", "length"):
                    yield error_body(f"generation ended early ({finish.reason})", kind="server_error")
                    return
                yield self._chunk(None, finish.reason)
                if include_usage:
                    yield {**self._envelope(self._chunk(None)["object"], []), "usage": _usage(finish)}
                return
        finally:
            ticket.cancel()  # the client left (or we are done): free the row at once


def _sse(chunks: AsyncIterator[dict], headers: dict[str, str]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})


async def _answer(request: Request, body: _Common, reply: _Reply, ticket: Ticket, queue: asyncio.Queue):
    request.state.reply = reply  # the access log reads its token counts
    if body.stream:
        return _sse(reply.stream(ticket, queue, _include_usage(body)), reply.headers)
    return JSONResponse(reply.body(await _wait_for_finish(request, reply, ticket, queue)), headers=reply.headers)


async def _wait_for_finish(request: Request, reply: _Reply, ticket: Ticket, queue: asyncio.Queue) -> Finish:
    """The request's Finish; if the client disconnects first, the request is cancelled at once."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, ticket))
    try:
        while True:
            event: Event = await queue.get()
            finish = event.finish
            if finish is None:
                continue
            reply.completion_tokens = finish.completion_tokens
            if finish.reason == "cancelled":
                raise ApiError(499, "the client closed the connection")
            if finish.reason not in ("stop", "length"):
                raise ApiError(500, f"generation ended early ({finish.reason})", kind="server_error")
            return finish
    finally:
        watcher.cancel()
        ticket.cancel()


async def _cancel_on_disconnect(request: Request, ticket: Ticket) -> None:
    # The body has been read, so the next message the server passes on is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
    ticket.cancel()


def _usage(finish: Finish) -> dict:
    return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": finish.cached_tokens}}


def _include_usage(body: _Common) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


class _AccessLog:
    """ASGI middleware: one line per request, whatever answered it (a route, a refusal, a bug)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500  # 500 unless a response starts
        state = scope.setdefault("state", {})  # where the route leaves its _Reply

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
