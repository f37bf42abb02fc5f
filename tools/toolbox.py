"""The tools a conversation may call, and the one way they run: in a worker process of their own.

``Toolbox.run(name, arguments)`` always returns a ``ToolResult`` the model can read and never raises:
an unknown name, bad arguments, a tool that raises, returns more than ``max_result_chars`` or runs
past ``timeout_s`` each give a one-line result beginning ``error:``.

Why a process: a running Python function cannot be stopped from outside, and a tool that calls
``sys.exit`` or crashes would take the caller with it; a process (leading its own group) can be
killed. The tools run in one long-lived worker (``tools.worker``) started at the first call, so a
call costs a round trip over a pipe; a timeout kills it and the next call starts a fresh one.
Memory is bounded by the time limit; the built-in calculator bounds its own."""

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

from tools.registry import Tool, ToolError, built_in, check_arguments

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_RESULT_CHARS = 2000
START_TIMEOUT_S = 60.0  # a fresh interpreter on a loaded machine; the call's own limit starts after
MAX_ARGUMENTS_CHARS = 100_000
ERROR_PREFIX = "error: "  # how every error result begins, whatever failed


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back from a call: the result, or an error beginning ``error:``."""

    text: str
    ok: bool


def error_result(message: str) -> ToolResult:
    return ToolResult(ERROR_PREFIX + message, False)


def load_tools(specs: list[str]) -> list[Tool]:
    """The tools ``specs`` name (``tools.registry``), refusing two with the same name. A user's
    functions are imported and described in a process of their own, so a module that exits or
    crashes as it is imported is one ``ToolError`` naming it."""
    tools = {spec: built_in(spec) for spec in specs if ":" not in spec}
    own = [spec for spec in specs if ":" in spec]
    tools.update(zip(own, _described_apart(own)) if own else ())
    names = [tools[spec].name for spec in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ToolError(f"two tools are named {repeated[0]!r}; give each tool once")
    return [tools[spec] for spec in specs]


def load_tool(spec: str) -> Tool:
    return load_tools([spec])[0]


def _described_apart(specs: list[str]) -> list[Tool]:
    """``python -m tools.worker --describe SPEC...``: one JSON line per spec, in order, so the first
    spec without its line is the one whose import ended the process."""
    try:
        done = subprocess.run([sys.executable, "-m", "tools.worker", "--describe", *specs], env=_worker_env(),
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=START_TIMEOUT_S)
        lines, ended = done.stdout.splitlines(), f"ended its process (exit code {done.returncode})"
    except subprocess.TimeoutExpired as late:
        lines, ended = (late.stdout or b"").splitlines(), f"did not finish within {START_TIMEOUT_S:g} s"
    described = [json.loads(line) for line in lines]
    for spec, reply in zip(specs, described):
        if not reply.pop("ok"):
            raise ToolError(reply["text"])
    if len(described) < len(specs):
        spec = specs[len(described)]
        raise ToolError(f"tool {spec!r}: importing {spec.partition(':')[0]} {ended}")
    return [Tool(**reply, reference=spec) for spec, reply in zip(specs, described)]


def _worker_env() -> dict[str, str]:
    """The caller's environment, with its import path: a tool is found where the caller would find it
    (a module:function beside train.py, say)."""
    path = os.pathsep.join(entry or os.getcwd() for entry in sys.path if isinstance(entry, str))
    return {**os.environ, "PYTHONPATH": path}


class Toolbox:
    """``tools`` by name, and the worker process that runs them; closing it (or leaving its context,
    or exiting) stops the worker."""

    def __init__(self, tools: list[Tool], *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 max_result_chars: int = DEFAULT_MAX_RESULT_CHARS) -> None:
        assert timeout_s > 0 and max_result_chars > 0
        self.tools = {tool.name: tool for tool in tools}
        self.timeout_s, self.max_result_chars = timeout_s, max_result_chars
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tools)

    def run(self, name: str, arguments: str) -> ToolResult:
        """Call tool ``name`` with ``arguments`` (a JSON object, as text: OpenAI's
        ``function.arguments``)."""
        tool = self.tools.get(name)
        if tool is None:
            return error_result(f"there is no tool {name!r} (the tools are: {', '.join(self.tools) or 'none'})")
        if len(arguments) > MAX_ARGUMENTS_CHARS:
            return error_result(f"the arguments are {len(arguments):,} characters, over the limit of "
                                f"{MAX_ARGUMENTS_CHARS:,}")
        try:
            parsed = json.loads(arguments)
        except (ValueError, RecursionError) as error:
            return error_result(f"the arguments are not JSON ({str(error)[:120]})")
        problem = check_arguments(tool, parsed)
        if problem is not None:
            return error_result(problem)
        with self._lock:
            return self._call(tool, parsed)

    def _call(self, tool: Tool, arguments: dict[str, Any]) -> ToolResult:
        try:
            if self._worker is None:
                self._worker = _Worker()
            reply = self._worker.exchange({"function": tool.reference, "arguments": arguments,
                                           "max_chars": self.max_result_chars}, self.timeout_s)
        except _WorkerGone as gone:
            self._stop_worker()
            return error_result(f"{tool.name} {gone}")
        except BaseException:  # Ctrl-C mid-call: the worker's reply would answer the next call
            self._stop_worker()
            raise
        return ToolResult(reply["text"], True) if reply["ok"] else error_result(reply["text"])

    def _stop_worker(self) -> None:
        if self._worker is not None:
            self._worker.kill()
            self._worker = None

    def close(self) -> None:
        with self._lock:
            if self._worker is not None:
                self._worker.close()
                self._worker = None

    def __enter__(self) -> "Toolbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WorkerGone(Exception):
    """The worker timed out or died; the message completes "<tool> ..."."""


class _Worker:
    """One ``tools.worker`` process, in a process group of its own, and its pipes."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tools.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            start_new_session=True, env=_worker_env(),
        )
        self._finalizer = weakref.finalize(self, _kill, self.process)
        self._buffer = b""
        self._read_line(START_TIMEOUT_S, "could not start its worker process")

    def exchange(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        try:
            self.process.stdin.write(json.dumps(request, ensure_ascii=False).encode("utf-8") + b"\n")
            self.process.stdin.flush()
        except OSError:
            raise _WorkerGone(f"could not run: its worker process ended (exit code {self.process.poll()})") from None
        return self._read_line(timeout_s, f"did not finish within {timeout_s:g} s")

    def _read_line(self, timeout_s: float, late: str) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        stdout = self.process.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([stdout], [], [], left)[0]:
                raise _WorkerGone(late)
            chunk = os.read(stdout, 65536)
            if not chunk:
                code = self.process.wait()
                raise _WorkerGone(f"ended its process without a result (exit code {code})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            return json.loads(line)
        except ValueError:
            raise _WorkerGone("sent back something unreadable") from None

    def kill(self) -> None:
        self._finalizer()

    def close(self) -> None:
        """End the worker by closing its stdin; kill it if it does not leave promptly."""
        try:
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._finalizer()


def _kill(process: subprocess.Popen) -> None:
    """Kill the worker's whole process group (what a tool started too) and reap it."""
    # The group outlives its leader while anything it started runs, and its id is not reused meanwhile.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()
    for pipe in (process.stdin, process.stdout):
        try:
            pipe.close()
        except OSError:
            pass
