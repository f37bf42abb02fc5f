"""Token ids -> text that is safe to print the moment it arrives.

A byte-level BPE token is a run of bytes, and one character can be split across tokens (an emoji
is four UTF-8 bytes). The bytes of every token go through one incremental UTF-8 decoder, which
holds an incomplete character back until its last byte arrives. It turns malformed bytes into
U+FFFD by the tokenizer's own rule, so the streamed pieces join to
``tokenizer.decode(ids, skip_special_tokens=False)``."""

import codecs
from typing import Sequence


class TextStream:
    """The text of one generated row, fed one token id at a time: ``push`` returns the new text
    that can be printed now, ``finish`` the rest. The text ends just before a stop string, and text
    that might start one is held back until it is known not to."""

    def __init__(self, token_bytes: Sequence[bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""  # decoded but not yet handed out: a possible start of a stop string
        self._pieces: list[str] = []
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything handed out so far (after ``finish``: the row's whole text)."""
        return "".join(self._pieces)

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        # Ids the tokenizer does not know (a model vocab padded past the tokenizer's) decode to
        # nothing, as in the tokenizer's own decode.
        data = self._token_bytes[token_id] if 0 <= token_id < len(self._token_bytes) else b""
        text = self._utf8.decode(data)
        if not self._stop:  # nothing to hold back: every whole character goes out as it comes
            if text:
                self._pieces.append(text)
            return text
        return self._release(text, final=False)

    def finish(self) -> str:
        """The held-back rest; an unfinished character at the very end becomes U+FFFD."""
        if self.stopped:
            return ""
        return self._release(self._utf8.decode(b"", final=True), final=True)

    def _release(self, new_text: str, *, final: bool) -> str:
        # Nothing handed out can begin a stop string (such suffixes are held back), so any stop
        # occurrence lies wholly inside the pending text: searching it alone is enough.
        pending = self._pending + new_text
        cut = min((i for i in (pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            out, self._pending = pending[:cut], ""
        elif final:
            out, self._pending = pending, ""
        else:
            held = self._stop_prefix_length(pending)
            out, self._pending = pending[: len(pending) - held], pending[len(pending) - held :]
        if out:
            self._pieces.append(out)
        return out

    def _stop_prefix_length(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
