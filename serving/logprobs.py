"""The engine's token log-probabilities in OpenAI's two shapes.

Legacy completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, four parallel
lists, each top entry a ``{token: logprob}`` object; with ``echo`` the prompt's tokens come first
and the first has ``null`` (nothing precedes it). Chat: ``{"content": [{"token", "logprob", "bytes",
"top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}``.

Completions list every generated token, an ending ``<|endoftext|>`` included, as OpenAI's legacy
completions did; chat leaves out the end token, as its text does. A token's text is its bytes
decoded as UTF-8; a token that holds part of a character has no text of its own, and is written
``bytes:\\xe2\\x80`` as OpenAI writes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from inference.engine import Event, Finish, TokenLogprob


def token_text(token_bytes: bytes) -> str:
    try:
        return token_bytes.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in token_bytes)


class CompletionLogprobs:
    """Builds the legacy completions object, counting ``text_offset`` from ``start`` (the length
    of the text before the first token reported: the prompt's, unless it is echoed)."""

    def __init__(self, token_bytes: Sequence[bytes], start: int = 0) -> None:
        self.token_bytes = token_bytes
        self.offset = start

    def build(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None]) -> dict:
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, logprob in zip(token_ids, logprobs):
            text = token_text(self.token_bytes[token_id])
            out["tokens"].append(text)
            out["text_offset"].append(self.offset)
            self.offset += len(text)
            if logprob is None:
                out["token_logprobs"].append(None)
                out["top_logprobs"].append(None)
            else:
                out["token_logprobs"].append(logprob.logprob)
                out["top_logprobs"].append({token_text(self.token_bytes[i]): value for i, value in logprob.top})
        return out


def chat_logprobs(token_bytes: Sequence[bytes], logprobs: Sequence[TokenLogprob]) -> dict:
    def entry(token_id: int, value: float) -> dict:
        raw = token_bytes[token_id]
        return {"token": token_text(raw), "logprob": value, "bytes": list(raw)}

    return {"content": [{**entry(lp.token_id, lp.logprob), "top_logprobs": [entry(i, v) for i, v in lp.top]}
                        for lp in logprobs], "refusal": None}


class ReplyLogprobs:
    """One reply's logprobs, in its endpoint's shape, for the whole body or chunk by chunk.
    ``wanted`` False: every ``logprobs`` field is null. Completions: ``prompt_text`` is what the
    offsets count from, and with ``echo`` the prompt's tokens come first. Chat: tokens in
    ``hidden`` (the end tokens, never shown) are left out."""

    def __init__(self, token_bytes: Sequence[bytes], wanted: bool, prompt_text: str = "", echo: bool = False,
                 *, chat: bool = False, hidden: Sequence[int] = ()) -> None:
        self.token_bytes, self.wanted, self.echo, self.chat, self.hidden = token_bytes, wanted, echo, chat, hidden
        self._offsets = CompletionLogprobs(token_bytes, 0 if echo else len(prompt_text))

    def whole(self, prompt_ids: Sequence[int], finish: Finish) -> dict | None:
        if not self.wanted:
            return None
        if self.chat:
            return chat_logprobs(self.token_bytes, [lp for lp in finish.logprobs if lp.token_id not in self.hidden])
        parts = [self._offsets.build(prompt_ids, finish.prompt_logprobs)] if self.echo else []
        parts.append(self._offsets.build(finish.token_ids, finish.logprobs))
        return {key: [item for part in parts for item in part[key]] for key in parts[-1]}

    def chunk(self, event: Event) -> dict | None:
        """The logprobs of one streamed event's token, or None."""
        if not self.wanted or event.logprob is None:
            return None
        if self.chat:
            return None if event.token_id in self.hidden else chat_logprobs(self.token_bytes, [event.logprob])
        return self._offsets.build([event.token_id], [event.logprob])
