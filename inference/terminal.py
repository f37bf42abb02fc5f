"""What ``generate.py`` reads from the user and writes back: text checked to be UTF-8, and output
that is never held in a buffer (the chat's typed lines: ``inference.chat_cli.LineReader``)."""

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
