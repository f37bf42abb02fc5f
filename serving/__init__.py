"""Serving a trained run to many users at once.

- ``inference.engine`` (one floor down) schedules every token; the server drives it from its thread.
- ``serving.api``: the FastAPI app and its routes, which only translate: OpenAI requests -> engine
  requests, engine events -> JSON/SSE; one log line per request.
- ``serving.schemas``: the OpenAI request bodies, as typed models, validated once.
- ``serving.errors``: OpenAI's error body, and ``ApiError``, the refusal a route raises.
- ``serving.service``: what the routes share (run, engine, limits): reading a body within its limit,
  a prompt or a chat made into token ids that fit, a request submitted to the engine.
- ``serving.replies``: the shape of each response kind (completion, chat), whole or as chunks.
- ``serving.logprobs``: the logprobs of a reply, in each endpoint's shape.
- ``serving.streaming``: a reply delivered as Server-Sent Events or whole; a client that leaves
  cancels its request.
- ``serving.cli``: the ``serve.py`` command line.

Nothing is imported here, so ``serve.py --help`` stays instant.
"""
