"""Delivering a reply while the engine generates it: as Server-Sent Events, or whole once it has
finished. A client that goes away cancels its request at once, freeing its row: a stream notices
by itself (its ``finally``), and a whole answer has a watcher listen for the disconnect."""

import asyncio
import json
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from inference.engine import Event, Finish, Ticket
from serving.errors import ApiError, error_body
from serving.replies import Reply
from serving.schemas import GenerationRequest

# The ways a generation ends normally; anything else ended it early (an engine failure).
FINISHED = ("stop", "length")


async def answer(request: Request, body: GenerationRequest, reply: Reply, ticket: Ticket,
                 queue: asyncio.Queue[Event]) -> StreamingResponse | JSONResponse:
    """The response to a generation request whose ticket feeds ``queue``, as ``body`` asked for it."""
    request.state.reply = reply  # the access log reads its token counts
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        return _sse(stream_chunks(reply, ticket, queue, include_usage), reply.headers)
    finish = await _wait_for_finish(request, reply, ticket, queue)
    return JSONResponse(reply.body(finish), headers=reply.headers)


async def stream_chunks(reply: Reply, ticket: Ticket, queue: asyncio.Queue[Event],
                        include_usage: bool) -> AsyncIterator[dict]:
    """The reply's stream chunks, from the engine's events on ``queue`` until its Finish; the
    ticket is cancelled whenever the stream stops, finished or abandoned."""
    try:
        for chunk in reply.opening():
            yield chunk
        while True:
            event = await queue.get()
            reply.completion_tokens += event.token_id is not None
            for chunk in reply.event_chunks(event, reply.logprobs.chunk(event)):
                yield chunk
            finish = event.finish
            if finish is None:
                continue
            if finish.reason not in FINISHED:
                yield error_body(f"generation ended early ({finish.reason})", kind="server_error")
                return
            for chunk in reply.closing_chunks(finish):
                yield chunk
            if include_usage:
                yield reply.usage_chunk(finish)
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


async def _wait_for_finish(request: Request, reply: Reply, ticket: Ticket, queue: asyncio.Queue[Event]) -> Finish:
    """The request's Finish; if the client disconnects first, the request is cancelled at once."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, ticket))
    try:
        while True:
            finish = (await queue.get()).finish
            if finish is None:
                continue
            reply.completion_tokens = finish.completion_tokens
            if finish.reason == "cancelled":
                raise ApiError(499, "the client closed the connection")
            if finish.reason not in FINISHED:
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
