"""The HTTP layer: OpenAI requests become engine requests, engine events become JSON or SSE.

Routes: ``GET /`` (the chat page, ``chat.html``), ``GET /health``, ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``.
Every refusal is an OpenAI error body with a 4xx status, and the server goes on serving. Text
streams as Server-Sent Events, one chunk per piece of whole characters, ending ``data: [DONE]``.
A client that goes away mid-request cancels it, which frees its row in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from data.chat import ChatTokenIds, render_chat, to_messages
from data.errors import DataError
from inference.completion import encode_prompt
from inference.runs import LoadedRun
from serving.engine import Engine, EngineBusy, Event, Finish, SamplingParams, Ticket
from serving.schemas import ChatCompletionRequest, CompletionRequest, _Common, error_body

# How long an overloaded server asks clients to wait before trying again (seconds).
RETRY_AFTER_S = 1


@dataclass(frozen=True)
class Limits:
    max_tokens_cap: int = 2048  # the largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when a request gives none (at most the cap)


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind, self.headers = status, param, code, kind, headers


class _Service:
    """What the routes share: the run, the engine, the limits, and the chat token ids (if any)."""

    def __init__(self, run: LoadedRun, engine: Engine, limits: Limits, model_id: str) -> None:
        self.run, self.engine, self.limits, self.model_id = run, engine, limits, model_id
        self.created = int(time.time())
        try:
            self.chat_ids: ChatTokenIds | None = ChatTokenIds.of(run.tokenizer)
            self.no_chat_reason = ""
        except DataError as error:
            self.chat_ids, self.no_chat_reason = None, str(error)
        # A token stands for at most this many characters, so a longer text cannot fit the context:
        # refused before the tokenizer spends time on it.
        self.max_prompt_chars = run.block_size * max(len(b) for b in run.token_bytes)

    def check_common(self, body: _Common) -> tuple[int, tuple[str, ...]]:
        if body.model != self.model_id:
            raise ApiError(404, f"model {body.model!r} does not exist; this server serves {self.model_id!r} "
                           "(GET /v1/models)", param="model", code="model_not_found")
        max_tokens = body.requested_max_tokens()
        if max_tokens is None:
            max_tokens = min(self.limits.default_max_tokens, self.limits.max_tokens_cap)
        if max_tokens > self.limits.max_tokens_cap:
            raise ApiError(400, f"max_tokens is {max_tokens} but this server allows at most "
                           f"{self.limits.max_tokens_cap}; ask for fewer", param="max_tokens")
        stop = body.stop_strings()
        if len(stop) > 4 or any(not s for s in stop):
            raise ApiError(400, "stop must be up to 4 non-empty strings", param="stop")
        return max_tokens, stop

    def check_length(self, chars: int, tokens: int | None, param: str) -> None:
        block = self.run.block_size
        if chars > self.max_prompt_chars or (tokens is not None and tokens > block):
            size = f"{tokens} tokens" if tokens is not None else f"{chars} characters"
            raise ApiError(400, f"the {param} is {size}, more than this model's context of {block} "
                           f"tokens; shorten it", param=param, code="context_length_exceeded")

    def submit(self, prompt_ids: list[int], params: SamplingParams, end_ids: list[int]) -> tuple[Ticket, asyncio.Queue]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def on_event(event: Event) -> None:  # called on the engine thread
            with contextlib.suppress(RuntimeError):  # the event loop has closed: shutting down
                loop.call_soon_threadsafe(queue.put_nowait, event)

        try:
            ticket = self.engine.submit(prompt_ids, params, on_event, end_ids=end_ids)
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

    app = FastAPI(title="minigpt", lifespan=lifespan)

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error_body(str(error), kind=error.kind, param=error.param, code=error.code),
                            status_code=error.status, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_request: Request, error: RequestValidationError) -> JSONResponse:
        message, param = _describe(error.errors())
        return JSONResponse(error_body(message, param=param), status_code=400)

    @app.get("/", include_in_schema=False)
    async def chat_page() -> FileResponse:
        return FileResponse(Path(__file__).with_name("chat.html"), media_type="text/html")

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
    async def completions(body: CompletionRequest, request: Request):
        max_tokens, stop = service.check_common(body)
        service.check_length(len(body.prompt), None, "prompt")
        prompt = encode_prompt(run, body.prompt)
        service.check_length(len(body.prompt), prompt.original_length, "prompt")
        params = SamplingParams(max_tokens, body.temperature, body.top_p, body.seed, stop)
        ticket, queue = service.submit(prompt.ids, params, [run.eot_id])
        reply = _Reply("cmpl", "text_completion", model_id, chat=False)
        if body.stream:
            return _sse(reply.stream(ticket, queue, _include_usage(body)))
        return reply.body(await _wait_for_finish(request, ticket, queue))

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        max_tokens, stop = service.check_common(body)
        if service.chat_ids is None:
            raise ApiError(400, f"this run cannot chat: {service.no_chat_reason}; /v1/completions "
                           "still works", param="messages", code="chat_not_supported")
        chars = sum(len(m.content) for m in body.messages)
        service.check_length(chars, None, "messages")
        try:
            messages = to_messages([{"role": m.role, "content": m.content} for m in body.messages])
        except DataError as error:
            raise ApiError(400, str(error), param="messages") from None
        ids = render_chat(run.tokenizer, messages, add_generation_prompt=True).ids
        service.check_length(chars, len(ids), "messages")
        params = SamplingParams(max_tokens, body.temperature, body.top_p, body.seed, stop)
        ticket, queue = service.submit(ids, params, [service.chat_ids.end, run.eot_id])
        reply = _Reply("chatcmpl", "chat.completion", model_id, chat=True)
        if body.stream:
            return _sse(reply.stream(ticket, queue, _include_usage(body)))
        return reply.body(await _wait_for_finish(request, ticket, queue))

    return app


class _Reply:
    """One response's id and shapes, for a whole body or for its stream of chunks."""

    def __init__(self, prefix: str, kind: str, model_id: str, *, chat: bool) -> None:
        self.id = f"{prefix}-{uuid.uuid4().hex}"
        self.kind, self.model_id, self.chat = kind, model_id, chat
        self.created = int(time.time())

    def _envelope(self, kind: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model_id,
                "choices": choices}

    def body(self, finish: Finish) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": finish.text},
                      "logprobs": None, "finish_reason": finish.reason}
        else:
            choice = {"index": 0, "text": finish.text, "logprobs": None, "finish_reason": finish.reason}
        return {**self._envelope(self.kind, [choice]), "usage": _usage(finish)}

    def _chunk(self, text: str | None, finish_reason: str | None = None, *, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            return self._envelope("chat.completion.chunk", [choice])
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._envelope("text_completion", [choice])

    async def stream(self, ticket: Ticket, queue: asyncio.Queue, include_usage: bool) -> AsyncIterator[dict]:
        try:
            if self.chat:
                yield self._chunk(None, role=True)
            while True:
                event: Event = await queue.get()
                if event.text:
                    yield self._chunk(event.text)
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


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _wait_for_finish(request: Request, ticket: Ticket, queue: asyncio.Queue) -> Finish:
    """The request's Finish; if the client disconnects first, cancel the request."""
    try:
        while True:
            try:
                event: Event = await asyncio.wait_for(queue.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    raise ApiError(499, "the client closed the connection") from None
                continue
            if event.finish is not None:
                if event.finish.reason not in ("stop", "length"):
                    raise ApiError(500, f"generation ended early ({event.finish.reason})", kind="server_error")
                return event.finish
    finally:
        ticket.cancel()


def _usage(finish: Finish) -> dict:
    return {"prompt_tokens": finish.prompt_tokens, "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens}


def _include_usage(body: _Common) -> bool:
    return body.stream_options is not None and body.stream_options.include_usage


def _describe(errors: list[dict]) -> tuple[str, str | None]:
    """One line for the first problem pydantic found, and the field it concerns."""
    first = errors[0]
    path = [str(part) for part in first.get("loc", ()) if part != "body"]
    field = ".".join(path) or None
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')}); send a JSON object", None
    if first.get("type") == "extra_forbidden":
        return f"unrecognized request argument: {field}; this server does not implement it", field
    if first.get("type") == "missing":
        return f"missing required field: {field}", field
    return f"{field}: {first.get('msg')} (got {first.get('input')!r:.60})", field
