"""The engine's token log-probabilities in OpenAI's two shapes.

Legacy completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, four parallel
lists, each top entry a ``{token: logprob}`` object; with ``echo`` the prompt's tokens come first
and the first has ``null`` (nothing precedes it). Chat: ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}``.

Completions list every generated token, an ending ``<|endoftext|>`` included, as OpenAI's legacy
completions did; chat leaves out the end token, as its text does. A token that holds part of a
character is written ``bytes:\\xe2\\x80`` as OpenAI writes it. ``text_offset`` indexes the text
itself: ``text[offset[i]:offset[i + 1]]`` is what token i adds to it. A character split over
several tokens is added by the token that completes it; a lone lead byte is one U+FFFD, added by
the token holding it. End tokens, an empty prompt's ``<|endoftext|>`` and tokens past a stop
string add nothing."""

import codecs
from collections.abc import Sequence
from typing import Protocol

from inference.engine import Event, Finish, TokenLogprob


def token_text(token_bytes: bytes) -> str:
    try:
        return token_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in token_bytes)


def text_offsets(token_bytes: Sequence[bytes], text_length: int, *, ends: Sequence[bool] = ()) -> list[int]:
    """Where each token's characters begin in the text decoded from their bytes, cut short at
    ``text_length``. ``ends[i]``: token i ends the text (it shows no bytes), so a character left
    unfinished before it is the previous token's U+FFFD."""
    characters = _Characters()
    return [min(characters.end() if i < len(ends) and ends[i] else characters.begin(raw), text_length)
            for i, raw in enumerate(token_bytes)]


class _Characters:
    """The characters of a UTF-8 byte stream fed token by token, and where each token's own begin:
    after every character whose last byte came before the token's first."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._count = 0

    def begin(self, raw: bytes) -> int:
        """Feed a token's bytes; where its characters begin."""
        start = self._count
        for position, byte in enumerate(raw):
            # The decoder shows an unfinished character's U+FFFD only at the byte after it. So of
            # the characters one byte brings out, the last is that byte's own when the decoder
            # holds nothing after it; the others end at the byte before.
            shown = self._decoder.decode(bytes((byte,)))
            if position == 0:
                own = 1 if shown and not self._decoder.getstate()[0] else 0
                start = self._count + len(shown) - own
            self._count += len(shown)
        return start

    def end(self) -> int:
        """The text ends here (at an end token, which shows no bytes): where the end token begins."""
        self._count += len(self._decoder.decode(b"", final=True))
        return self._count


class CompletionLogprobs:
    """Builds the legacy completions object for tokens that make one piece of text; tokens in
    ``hidden`` end the text without showing."""

    def __init__(self, token_bytes: Sequence[bytes], hidden: Sequence[int] = ()) -> None:
        self.token_bytes, self.hidden = token_bytes, hidden

    def build(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None], offsets: Sequence[int]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": list(offsets)}
        for token_id, logprob in zip(token_ids, logprobs):
            out["tokens"].append(token_text(self.token_bytes[token_id]))
            if logprob is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
            else:
                out["token_logprobs"].append(logprob.logprob)
                out["top_logprobs"].append({token_text(self.token_bytes[i]): value for i, value in logprob.top})
        return out

    def whole(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None], text: str,
              start: int) -> dict:
        """The object for tokens whose whole text (cut short or not) is ``text``."""
        raw = [self.token_bytes[i] for i in token_ids]
        offsets = text_offsets(raw, len(text), ends=[i in self.hidden for i in token_ids])
        return self.build(token_ids, logprobs, [start + offset for offset in offsets])


def chat_logprobs(token_bytes: Sequence[bytes], logprobs: Sequence[TokenLogprob]) -> dict:
    def entry(token_id: int, value: float) -> dict:
        raw = token_bytes[token_id]
        return {"token": token_text(raw), "logprob": value, "bytes": list(raw)}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
                        for lp in logprobs], "refusal": None}


class ReplyLogprobs(Protocol):
    """One reply's logprobs, in its endpoint's shape, for the whole body or chunk by chunk; None
    where the request asked for none."""

    def whole(self, prompt_ids: Sequence[int], finish: Finish) -> dict | None: ...

    def chunk(self, event: Event) -> dict | None: ...


class CompletionReplyLogprobs:
    """A completion's logprobs (``wanted`` False: null), its end tokens (``hidden``) listed. ``text_offset``
    indexes ``prompt_text`` then the reply's text, as OpenAI's does, echoed or not, streamed or not."""

    def __init__(self, token_bytes: Sequence[bytes], wanted: bool, prompt_text: str = "", echo: bool = False,
                 *, hidden: Sequence[int] = ()) -> None:
        self.token_bytes, self.wanted, self.echo, self.prompt_text = token_bytes, wanted, echo, prompt_text
        self._completion = CompletionLogprobs(token_bytes, hidden)
        self._streamed = len(prompt_text)  # characters streamed so far, the prompt's included
        self._characters = _Characters()  # the streamed tokens' characters, for their offsets

    def whole(self, prompt_ids: Sequence[int], finish: Finish) -> dict | None:
        if not self.wanted:
            return None
        # The prompt's text and the reply's are decoded apart (the prompt's own unfinished
        # character, if any, is its last token's U+FFFD), as the text itself is.
        prompt = CompletionLogprobs(self.token_bytes)
        parts = [prompt.whole(prompt_ids, finish.prompt_logprobs, self.prompt_text, 0)] if self.echo else []
        parts.append(self._completion.whole(finish.token_ids, finish.logprobs, finish.text, len(self.prompt_text)))
        return {key: [item for part in parts for item in part[key]] for key in parts[-1]}

    def chunk(self, event: Event) -> dict | None:
        self._streamed += len(event.text)
        if not self.wanted or event.logprob is None:
            return None
        token_id = event.token_id
        begins = self._characters.end() if token_id in self._completion.hidden else \
            self._characters.begin(self.token_bytes[token_id])
        # As in the whole body: not past the text (a stop string's characters are never shown).
        offset = min(len(self.prompt_text) + begins, self._streamed)
        return self._completion.build([token_id], [event.logprob], [offset])


class ChatReplyLogprobs:
    """A chat reply's logprobs (``wanted`` False: null), its end tokens (``hidden``) left out."""

    def __init__(self, token_bytes: Sequence[bytes], wanted: bool, *, hidden: Sequence[int] = ()) -> None:
        self.token_bytes, self.wanted, self.hidden = token_bytes, wanted, hidden

    def whole(self, prompt_ids: Sequence[int], finish: Finish) -> dict | None:
        if not self.wanted:
            return None
        return chat_logprobs(self.token_bytes, [lp for lp in finish.logprobs if lp.token_id not in self.hidden])

    def chunk(self, event: Event) -> dict | None:
        if not self.wanted or event.logprob is None or event.token_id in self.hidden:
            return None
        return chat_logprobs(self.token_bytes, [event.logprob])
