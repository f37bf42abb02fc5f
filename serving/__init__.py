"""Serving a trained run to many users at once.

- ``inference.engine`` (one floor down) schedules every token; the server drives it from its thread.
- ``serving.schemas``: the OpenAI request bodies, as typed models.
- ``serving.api``: the FastAPI app: OpenAI requests -> engine requests, engine events -> JSON/SSE.
- ``serving.cli``: the ``serve.py`` command line.

Nothing is imported here, so ``serve.py --help`` stays instant.
"""
