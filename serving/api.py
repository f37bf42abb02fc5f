"""The HTTP layer: OpenAI requests become engine requests, engine events become JSON or SSE.

Every refusal is an OpenAI error body with a 4xx status (an unknown route or method included), and
the server goes on serving. A chat longer than the model's window is cut by the chat format's
policy (``data.chat.fit_for_reply``) and answered; the ``X-Dropped-Messages`` header says how many
messages were left out, and the reply ends where the window is full (a rotary or no-position run's
rolls on). ``AccessLog`` logs one line per request on the ``serving.access`` logger (client, method,
path, status, tokens in and out, and time), wrapping the whole app so that a refusal or a bug is
logged as surely as a reply."""

import contextlib
import logging
import time
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from inference.engine import Engine
from inference.sampling import SamplingSettings
from rundir.loading import LoadedRun
from serving.errors import ApiError, error_body
from serving.logprobs import ChatReplyLogprobs, CompletionReplyLogprobs
from serving.replies import ChatReply, CompletionReply
from serving.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from serving.service import Limits, Service
from serving.streaming import answer

access_log = logging.getLogger("serving.access")


def create_app(run: LoadedRun, engine: Engine, *, model_id: str, limits: Limits = Limits()) -> FastAPI:
    """The ASGI app. Its lifespan starts the engine's loop and stops it on shutdown."""
    service = Service(run, engine, limits, model_id)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine.start()
        try:
            yield
        finally:
            engine.stop()

    page = Path(__file__).with_name("chat.html").read_text(encoding="utf-8")
    app = FastAPI(title="minigpt", lifespan=lifespan)
    app.add_middleware(AccessLog)

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
        # The whole page, whatever Range a client sends: it is small and only useful whole.
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
        logprobs = CompletionReplyLogprobs(run.token_bytes, wanted, text, body.echo, hidden=(run.eot_id,))
        reply = CompletionReply(model_id, ids, logprobs, echo=text if body.echo else "")
        return await answer(request, body, reply, ticket, queue)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await service.read(request, ChatCompletionRequest)
        prompt = service.chat_prompt(body)
        params = _settings(body, suppress_ids=prompt.suppress_ids)
        top = (body.top_logprobs or 0) if body.logprobs else None
        # A reply runs past the window only by rolling (inference.chat says why).
        ticket, queue = service.submit(prompt.ids, params, list(prompt.special.reply_end_ids), top,
                                       slide=service.engine.window.rolls)
        logprobs = ChatReplyLogprobs(run.token_bytes, body.logprobs, hidden=prompt.special.reply_end_ids)
        reply = ChatReply(model_id, prompt.ids, logprobs, headers={"X-Dropped-Messages": str(prompt.dropped)},
                          calls=prompt.calls)
        return await answer(request, body, reply, ticket, queue)

    return app


def _settings(body: GenerationRequest, suppress_ids: tuple[int, ...] = ()) -> SamplingSettings:
    """The engine's sampling settings for a request (top_k is not an OpenAI field)."""
    return SamplingSettings(max_new_tokens=body.max_new_tokens, temperature=body.temperature, top_k=None,
                            top_p=body.top_p, seed=body.seed, stop=body.stop_strings(), suppress_ids=suppress_ids)


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
