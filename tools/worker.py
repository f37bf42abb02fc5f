"""The process that runs tools for a ``tools.toolbox.Toolbox``: ``python -m tools.worker``.

It reads one JSON request per line on stdin (``{"function": "module:function", "arguments": {...},
"max_chars": N}``) and writes one line back: ``{"ok": true|false, "text": ...}``. Whatever the tool
does cannot break that exchange: the protocol's pipes are moved to private descriptors, the tool's
stdout goes to stderr and its stdin to /dev/null. A result over ``max_chars`` is refused here, so it
never crosses the pipe. ``--describe module:function...`` writes each tool's description instead,
so the caller never imports a user's module itself."""

import json
import os
import sys
from typing import Any, BinaryIO

from tools.registry import ToolError, describe, failure, import_function

MAX_ERROR_CHARS = 300


def main() -> None:
    requests, replies = _private_pipes()
    try:
        if sys.argv[1:2] == ["--describe"]:
            for reference in sys.argv[2:]:
                _send(replies, _description(reference))
            return
        _send(replies, {"ready": True})
        functions: dict[str, Any] = {}
        for line in requests:
            request = json.loads(line)
            _send(replies, call(functions, request["function"], request["arguments"], request["max_chars"]))
    except OSError:  # a tool closed the pipes: the caller reads an ended worker, not our traceback
        os._exit(1)


def _description(reference: str) -> dict[str, Any]:
    """``--describe``: the tool ``reference`` names, as the fields of a ``Tool`` (or what is wrong)."""
    try:
        tool = describe(import_function(reference), reference)
    except ToolError as error:
        return {"ok": False, "text": str(error)}
    return {"ok": True, "name": tool.name, "description": tool.description, "parameters": tool.parameters}


def call(functions: dict[str, Any], reference: str, arguments: dict[str, Any], max_chars: int) -> dict[str, Any]:
    """Run one tool call; its reply. Nothing a tool raises escapes, not even SystemExit."""
    try:
        if reference not in functions:
            functions[reference] = import_function(reference)
        # A lone surrogate cannot cross the pipe as UTF-8, nor be tokenized: it becomes "?".
        text = as_text(functions[reference](**arguments)).encode("utf-8", "replace").decode("utf-8")
    except ToolError as error:
        return {"ok": False, "text": _bounded(str(error))}
    except BaseException as error:  # noqa: BLE001 - the tool's failure is its result
        return {"ok": False, "text": _bounded(failure(error))}
    if len(text) > max_chars:
        return {"ok": False, "text": f"the result is {len(text):,} characters, over the limit of {max_chars:,}"}
    return {"ok": True, "text": text}


def as_text(value: Any) -> str:
    """A tool's return value as the text the model reads: text as it is, anything else as JSON
    (or ``str`` when it is not JSON)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def _bounded(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."


def _private_pipes() -> tuple[BinaryIO, BinaryIO]:
    """The protocol's pipes on descriptors of their own; fd 0 becomes /dev/null and fd 1 stderr."""
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115 - for the life of the process
    sys.stdout = sys.stderr
    return requests, replies


def _send(replies: BinaryIO, message: dict[str, Any]) -> None:
    replies.write(json.dumps(message, ensure_ascii=False).encode("utf-8") + b"\n")
    replies.flush()


if __name__ == "__main__":
    main()
