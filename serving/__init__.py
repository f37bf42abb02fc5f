"""Serving a trained run to many users at once.

- ``serving.engine``: the inference engine. One background loop owns the model and a KV cache of
  ``max_batch`` rows, and schedules every token (continuous batching). Usable without a socket.
- ``serving.schemas``: the OpenAI request bodies, as typed models.
- ``serving.api``: the FastAPI app: OpenAI requests -> engine requests, engine events -> JSON/SSE.
- ``serving.cli``: the ``serve.py`` command line.

Nothing is imported here, so ``serve.py --help`` stays instant.
"""
