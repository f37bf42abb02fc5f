"""A conversation with a chat-tuned run, turn by turn, over one KV cache.

The session keeps the window of token ids the model sees, starting at position 0 (learned
positions: a conversation always starts there, as in fine-tuning), and its KV cache holds the
first ``cache.lengths[0]`` of them. Each user turn is rendered by ``data.chat`` and appended; only the ids
the cache has not seen are run through the model, so the history is never re-encoded while it
fits. When the window would overflow, the oldest whole turns are dropped (the system prompt is
kept while it fits), the rest is re-encoded from position 0, and the session says so. This is not
``model.generation.window_start``, the slide of plain text, which may cut anywhere: a window cut
inside a turn would open on message text with no role token, a conversation no template renders.
Without the cache (``use_cache=False``) the whole window is recomputed for every token: the
reference the cached path is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from common.errors import UserError
from data.chat import ChatTokenIds, Message, render_chat
from inference.settings import GenerationSettings
from inference.streaming import TextStream
from model.generation import new_seed, sample_next_token, seeded_generator
from rundir.loading import LoadedRun


@dataclass(frozen=True)
class ChatReply:
    text: str
    token_ids: list[int]  # generated ids, the closing <|end|> included when the model produced it
    finish_reason: str  # "end": the model ended its turn; "length": max_new_tokens or a full window


# In a reply the role tokens are never sampled, and <|end|> or <|endoftext|> ends it unseen: the
# rule of data.chat.ChatTokenIds, which the server's chat endpoint applies too.


class ChatSession:
    """One conversation; ``reply`` adds a user turn and returns the model's answer."""

    def __init__(
        self, run: LoadedRun, settings: GenerationSettings, *, system_prompt: str | None = None,
        use_cache: bool = True, on_notice: Callable[[str], None] | None = None,
    ) -> None:
        self.run = run
        self.special = ChatTokenIds.of(run.tokenizer)  # a run from before the chat format: one-line error
        suppress_ids = tuple(sorted({*settings.suppress_ids, *self.special.suppress_ids}))
        self.settings = replace(settings, suppress_ids=suppress_ids)
        self.block_size = run.block_size
        self.system_turn = render_chat(run.tokenizer, [Message("system", system_prompt)]).ids if system_prompt else []
        if len(self.system_turn) >= self.block_size // 2:
            raise UserError(
                f"the system prompt is {len(self.system_turn)} tokens, too much of the model's {self.block_size}-token "
                "window; shorten it"
            )
        self.seed = settings.seed if settings.seed is not None else new_seed()
        self.generator = seeded_generator(self.seed)
        self.cache = run.model.init_cache(1) if use_cache else None
        self.on_notice = on_notice or (lambda message: None)
        self.tokens_encoded = 0  # positions run through the model: shows the history is reused
        self.reset()

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays)."""
        self.turns: list[list[int]] = [self.system_turn] if self.system_turn else []
        self.window: list[int] = list(self.system_turn)
        if self.cache is not None:
            self.cache.reset()

    def reply(self, user_text: str, on_text: Callable[[str], None] | None = None) -> ChatReply:
        """Append the user's turn, generate the reply (streamed through ``on_text``), keep both."""
        prompt = render_chat(self.run.tokenizer, [Message("user", user_text)], add_generation_prompt=True).ids
        if len(prompt) + len(self.system_turn) >= self.block_size:
            raise UserError(
                f"the message is {len(prompt)} tokens; with the system prompt it does not fit the model's "
                f"{self.block_size}-token window: shorten it"
            )
        # Room for the prompt and a quarter window of reply before anything has to move again.
        reserve = max(1, self.block_size // 4)
        if not self._make_room(len(prompt) + reserve, current=[]):
            self._make_room(len(prompt), current=[])
        self.window += prompt
        stream = TextStream(self.run.token_bytes)
        generated: list[int] = []
        finish = "length"
        emit = on_text or (lambda text: None)
        for _ in range(self.settings.max_new_tokens):
            if len(self.window) > self.block_size:
                current = prompt + generated
                if not self._make_room(reserve, current=current) and not self._make_room(0, current=current):
                    break  # this exchange alone fills the window
            token = self._next_token()
            generated.append(token)
            if token in self.special.reply_end_ids:
                finish = "end"
                break
            self.window.append(token)
            emit(stream.push(token))
        emit(stream.finish())
        # Close the turn as the template renders it, whichever token ended it (if any did).
        reply = generated[:-1] if finish == "end" else generated
        self.window.append(self.special.end)
        self.turns += [prompt[:-1], [prompt[-1], *reply, self.special.end]]
        return ChatReply(stream.text, generated, finish)

    @torch.inference_mode()
    def _next_token(self) -> int:
        # With the cache only the ids it has not seen yet; without it, the whole window every time.
        ids = self.window[self.cache.lengths[0] :] if self.cache is not None else self.window
        self.tokens_encoded += len(ids)
        idx = torch.tensor([ids], dtype=torch.long, device=self.run.device)
        logits = self.run.model.next_token_logits(idx, self.cache)
        s = self.settings
        prev = torch.tensor([self.window], device=self.run.device) if s.repetition_penalty != 1.0 else None
        token = sample_next_token(logits, **s.token_options(), prev_tokens=prev, generator=self.generator)
        return int(token.item())

    def _make_room(self, needed: int, *, current: list[int]) -> bool:
        """Drop the oldest whole turns (the system prompt last) until they, the exchange in
        progress (``current``) and ``needed`` more tokens fit the window; if any went, re-encode
        from position 0 and say so. Returns whether it fits."""

        def size(turns: list[list[int]]) -> int:
            return sum(len(t) for t in turns) + len(current) + needed

        turns = list(self.turns)
        while turns and size(turns) > self.block_size:
            keeps_system = turns[0] is self.system_turn and len(turns) > 1
            turns.pop(1 if keeps_system else 0)
        if len(turns) < len(self.turns):
            dropped = len(self.turns) - len(turns)
            self.turns = turns
            self.window = [t for turn in turns for t in turn] + current
            if self.cache is not None:
                self.cache.reset()
            kept = f"kept the last {len(turns)}" if turns else "kept none"
            self.on_notice(
                f"the conversation filled the model's {self.block_size}-token window: dropped the {dropped} "
                f"oldest turn(s), {kept}, and re-encoded from position 0"
            )
        return size(turns) <= self.block_size
