"""The `data:` section of a run config: a bad value raises `DataError` before any corpus is read."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from common.config import Section, build, require
from common.errors import DataError
from data.tokenizer import SPECIAL_TOKENS

SOURCES = ("shakespeare", "hub", "files", "synthetic", "quotes", "calculator")
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # bytes, end-of-text, chat and tool tokens
# The sources that hold conversations (data/sources/conversations.py); calculator holds nothing else.
CHAT_SOURCES = ("shakespeare", "hub", "files", "calculator")
# text: documents for pretraining; chat: conversations for fine-tuning; preference: chosen and
# rejected replies to a prompt, for preference optimisation (DPO); rl: questions with checkable
# answers, for reinforcement learning (GRPO; the prompts come from the run's rl section)
FORMATS = ("text", "chat", "preference", "rl")


class HubSourceConfig(Section):
    """A dataset on the Hugging Face hub, or a local directory laid out like one.

    `max_documents` / `max_bytes` cap the corpus (whole documents, taken in order until the cap is
    reached). When the dataset has its own `val_split`, `val_fraction` of each cap goes to it and
    the rest to `train_split`; otherwise the capped `train_split` is hash-split like any corpus.
    """

    name: str = ""
    config_name: str | None = None
    train_split: str = "train"
    val_split: str | None = "validation"
    text_column: str = "text"
    streaming: bool = False
    max_documents: int | None = Field(None, ge=1)
    max_bytes: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _streaming_is_capped(self) -> HubSourceConfig:
        require(not self.streaming or self.max_documents is not None or self.max_bytes is not None,
                "data.hub.streaming reads a slice of a large corpus: set data.hub.max_documents "
                "or data.hub.max_bytes (or set data.hub.streaming: false)")
        return self


class FilesSourceConfig(Section):
    """Local .txt / .jsonl / .parquet files (paths or globs, optionally .gz/.bz2/.xz/.zst); what a
    document is: see data/sources/local_files.py."""

    paths: list[str] = []
    format: Literal["auto", "txt", "jsonl", "parquet"] = "auto"
    text_column: str = "text"
    encoding_errors: Literal["strict", "replace"] = "strict"
    txt_document: Literal["file", "paragraph", "line"] = "file"


# The synthetic corpus is made in memory, each word of it a few bytes of text twice over (a list,
# then the dataset): this bound keeps it to a few hundred megabytes, far above the induction lab's.
MAX_SYNTHETIC_WORDS = 50_000_000


class SyntheticSourceConfig(Section):
    """Random sequences of made-up words, each written twice (data/sources/synthetic.py): the induction lab's
    corpus. Sequences are ``min_words..max_words`` distinct words from a list of ``words``."""

    seed: int = 0
    documents: int = Field(20000, ge=1)
    words: int = Field(256, ge=2, le=10000)
    min_words: int = 8
    max_words: int = 40

    @model_validator(mode="after")
    def _fits(self) -> SyntheticSourceConfig:
        require(1 <= self.min_words <= self.max_words <= self.words,
                "data.synthetic needs 1 <= min_words <= max_words <= words (a sequence repeats no word), "
                f"got min_words {self.min_words}, max_words {self.max_words}, words {self.words}")
        most = 2 * self.documents * self.max_words  # each sequence is written twice
        require(most <= MAX_SYNTHETIC_WORDS,
                f"data.synthetic asks for up to {most:,} words (2 x documents x max_words), more than the "
                f"{MAX_SYNTHETIC_WORDS:,} it makes in memory; lower data.synthetic.documents or max_words")
        return self


# The quoting corpus is made in memory too: passages up to this many characters (twice each).
MAX_QUOTE_CHARACTERS = 200_000_000


class QuotesSourceConfig(Section):
    """Passages of the plays, each written twice (data/sources/quotes.py): a corpus that teaches a
    model to copy its context. ``passages`` passages of ``min_chars..max_chars`` characters."""

    seed: int = 0
    passages: int = Field(20000, ge=1)
    min_chars: int = Field(60, ge=1)
    max_chars: int = Field(220, le=100_000)

    @model_validator(mode="after")
    def _fits(self) -> QuotesSourceConfig:
        require(self.min_chars <= self.max_chars, f"data.quotes needs min_chars <= max_chars, "
                f"got min_chars {self.min_chars}, max_chars {self.max_chars}")
        most = 2 * self.passages * self.max_chars  # each passage is written twice
        require(most <= MAX_QUOTE_CHARACTERS,
                f"data.quotes asks for up to {most:,} characters (2 x passages x max_chars), more than the "
                f"{MAX_QUOTE_CHARACTERS:,} it makes in memory; lower data.quotes.passages or max_chars")
        return self


# A ceiling on the calculator problems a run draws and holds in memory (a few hundred bytes each).
MAX_CALCULATOR_PROBLEMS = 1_000_000
CALCULATOR_OPERATIONS = "+-*/"


class CalculatorShapes(Section):
    """The shapes of the calculator problems (data/sources/tool_arithmetic.py), shared by the SFT source
    (``data.calculator``) and the RL task (``rl.calculator``), so the same settings draw the same problems:
    2 to ``max_terms`` operands of 1 to ``digits`` digits joined by ``operations`` (some of ``+-*/``),
    ``parentheses`` around some of them, ``words`` for some questions ("7 times 3"); conversations of
    1 to ``max_exchanges`` exchanges, a share ``plays_share`` of them holding the plays' exchanges too."""

    seed: int = 0
    digits: int = Field(3, ge=1, le=4)
    operations: str = "*"
    max_terms: int = Field(2, ge=2, le=4)
    parentheses: bool = False
    words: bool = False
    max_exchanges: int = Field(1, ge=1, le=4)
    # Past 0.9 the plays' exchanges outnumber the calculator's tenfold: a plays set, not a tool set.
    plays_share: float = Field(0.0, ge=0, le=0.9)

    def check_count(self, key: str, count_key: str, count: int) -> None:
        """Refuse in one line ``count`` problems (``key``.``count_key``) that cannot be drawn."""
        require(1 <= count <= MAX_CALCULATOR_PROBLEMS,
                f"{key}.{count_key} must be from 1 to {MAX_CALCULATOR_PROBLEMS:,}, got {count}")
        require(self.operations != "" and set(self.operations) <= set(CALCULATOR_OPERATIONS),
                f"{key}.operations must be some of {CALCULATOR_OPERATIONS!r}, got {self.operations!r}")
        # Parentheses only add to these; the few the calculator refuses (x/0, products past 10**15) are redrawn.
        ops = len(set(self.operations))
        distinct = sum(10 ** (self.digits * terms) * ops ** (terms - 1) for terms in range(2, self.max_terms + 1))
        require(count <= distinct // 2,
                f"{key}.{count_key} is {count:,}, more than half the {distinct:,} distinct problems its digits, "
                "operations and max_terms make; ask for fewer or widen them")


class CalculatorSourceConfig(CalculatorShapes):
    """Conversations that call the built-in calculator: ``problems`` drawn, the held-out share first."""

    problems: int = 4000

    @model_validator(mode="after")
    def _drawable(self) -> CalculatorSourceConfig:
        self.check_count("data.calculator", "problems", self.problems)
        return self


class DataConfig(Section):
    """Where the corpus comes from, how it is split, and the tokenizer trained on it."""

    source: Literal[SOURCES] = "shakespeare"
    format: Literal[FORMATS] = Field("text", description="what the corpus holds; all but text need init_from")
    # The 256 byte symbols and the special tokens (data/tokenizer.py) are the smallest vocabulary the
    # tokenizer trainer makes; uint32 token files cap it far above anything trained here.
    vocab_size: int = Field(2048, ge=MIN_VOCAB_SIZE, le=2**32 - 1)
    val_fraction: float = Field(0.1, gt=0, lt=1)
    split_seed: int = 1234
    cache_dir: str = Field("data_cache", min_length=1)
    hub: HubSourceConfig = HubSourceConfig()
    files: FilesSourceConfig = FilesSourceConfig()
    synthetic: SyntheticSourceConfig = SyntheticSourceConfig()
    quotes: QuotesSourceConfig = QuotesSourceConfig()
    calculator: CalculatorSourceConfig = CalculatorSourceConfig()
    tokenize_batch_size: int = Field(1024, ge=1, description="documents per encode_batch call")

    @model_validator(mode="after")
    def _source_fits_format(self) -> DataConfig:
        require(self.source != "calculator" or self.format == "chat",
                "data.source calculator makes conversations that call the calculator: use it with data.format: chat")
        require(self.format != "chat" or self.source in CHAT_SOURCES,
                f"data.source {self.source} makes text, not conversations, so data.format: chat cannot read it; "
                f"use data.source {', '.join(CHAT_SOURCES[:-1])} or {CHAT_SOURCES[-1]}, or data.format: text")
        require(self.source != "hub" or self.hub.name != "",
                "data.source is 'hub' but data.hub.name is empty: set it to a hub dataset "
                "(e.g. roneneldan/TinyStories) or a local dataset directory")
        require(self.format != "preference" or self.source in ("files", "hub"),
                f"data.format: preference reads reply pairs from data.source files or hub, not {self.source!r}; "
                "build the built-in set from a chat run with python -m training.tasks.dpo.preference_set")
        require(self.source != "files" or self.files.paths != [],
                "data.source is 'files' but data.files.paths is empty: list .txt, .jsonl or "
                ".parquet paths or globs")
        return self

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataConfig:
        """Build from a plain dict (e.g. parsed YAML); unknown keys are errors, not ignored."""
        return build(cls, d, "data", DataError)
