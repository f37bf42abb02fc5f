"""OpenAI's error shape, and the one exception a route raises to answer with it.

Every refusal the server makes (a bad body, an over-size one, a busy engine, a client that left)
is an ``ApiError``; the app turns it into ``error_body`` with its status, and goes on serving."""


def error_body(message: str, *, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class ApiError(Exception):
    """A refusal with its HTTP status; ``kind``, ``param`` and ``code`` fill OpenAI's error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code, self.kind, self.headers = status, param, code, kind, headers
