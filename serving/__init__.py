"""Serving a trained run to many users at once, over OpenAI's API (``serve.py``); ``inference.engine``
schedules every token, and the routes (``serving.api``) only translate requests and events.

Nothing is imported here, so ``serve.py --help`` stays instant."""
