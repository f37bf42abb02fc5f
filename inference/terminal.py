"""What ``generate.py`` reads from the user and writes back: text checked to be UTF-8, lines typed
at a prompt (with line editing where the terminal allows it), and output that is never held in a
buffer."""

from __future__ import annotations

import codecs
import sys

from common.errors import UserError


def decode_utf8(data: bytes, source: str) -> str:
    """``data`` as text; bytes that are not UTF-8 are refused in one line naming ``source``."""
    # A byte-order mark (as some Windows editors write) is never meant as text.
    data = data.removeprefix(codecs.BOM_UTF8)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UserError(
            f"{source} is not valid UTF-8 (byte 0x{data[error.start]:02x} at offset {error.start}); "
            "convert it to UTF-8"
        ) from None


def decode_argument(text: str, source: str) -> str:
    """A command-line argument as text; bytes that were not UTF-8 are refused, naming ``source``."""
    return decode_utf8(text.encode("utf-8", errors="surrogateescape"), source)


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout at once (streamed text must not wait in a buffer)."""
    sys.stdout.write(text)
    sys.stdout.flush()


class LineReader:
    """Lines from stdin, one turn each; ``read`` returns None at end of input (Ctrl-D). At a terminal
    they go through ``input`` (``readline`` editing and history); otherwise the prompt goes to
    stderr, so stdout holds only replies, and lines are read as bytes and checked to be UTF-8."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.interactive = sys.stdin.isatty()
        self.terminal = self.interactive and sys.stdout.isatty()
        if self.terminal:
            try:
                import readline  # noqa: F401  (importing it is what makes input() edit lines)
            except ImportError:  # Windows, or a Python built without it: input() still works
                pass

    def half_typed(self) -> bool:
        """Whether a line was being typed at the terminal (read after ``read`` was interrupted)."""
        if not self.terminal:
            return False
        try:
            import readline
        except ImportError:
            return False
        return bool(readline.get_line_buffer())

    def read(self) -> str | None:
        """The next line without its line ending; a UserError for a line that is not UTF-8 (the
        line is consumed, so the next ``read`` goes on after it)."""
        if self.terminal:
            try:
                text = input(self.prompt)
            except EOFError:
                return None
            except UnicodeDecodeError:
                raise UserError("that line is not valid UTF-8; type it again") from None
            # Under a C locale Python reads undecodable bytes as surrogate escapes: refuse those too.
            return decode_argument(text, "that line")
        if self.interactive:
            print(self.prompt, end="", file=sys.stderr, flush=True)
        data = sys.stdin.buffer.readline()
        if not data:
            return None
        return decode_utf8(data.removesuffix(b"\n").removesuffix(b"\r"), "that line")
