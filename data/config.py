"""The `data:` section of a run config, as typed dataclasses validated on construction.

A bad value raises `DataError` naming the key and what to write instead, so a typo in YAML fails
before any corpus is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from common.config import build, check_types, require
from data.chat import CHAT_SPECIAL_TOKENS, TOOL_SPECIAL_TOKENS
from data.errors import DataError

SOURCES = ("shakespeare", "hub", "files", "synthetic", "quotes", "calculator")
MIN_VOCAB_SIZE = 256 + 1 + len(CHAT_SPECIAL_TOKENS) + len(TOOL_SPECIAL_TOKENS)  # bytes, end-of-text, chat and tool tokens
# The sources that hold conversations (data/sources/conversations.py); calculator holds nothing else.
CHAT_SOURCES = ("shakespeare", "hub", "files", "calculator")
# text: documents for pretraining; chat: conversations for fine-tuning; preference: chosen and
# rejected replies to a prompt, for preference optimisation (DPO); rl: questions with checkable
# answers, for reinforcement learning (GRPO; the prompts come from the run's rl section)
FORMATS = ("text", "chat", "preference", "rl")
FILE_FORMATS = ("auto", "txt", "jsonl", "parquet")
TXT_DOCUMENTS = ("file", "paragraph", "line")
ENCODING_ERRORS = ("strict", "replace")


@dataclass
class HubSourceConfig:
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
    max_documents: int | None = None
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        check_types(self, "data.hub", DataError)
        for key in ("max_documents", "max_bytes"):
            value = getattr(self, key)
            _require(value is None or value >= 1, f"data.hub.{key} must be a positive integer or null, got {value}")
        _require(not self.streaming or self.max_documents is not None or self.max_bytes is not None,
                 "data.hub.streaming reads a slice of a large corpus: set data.hub.max_documents "
                 "or data.hub.max_bytes (or set data.hub.streaming: false)")


@dataclass
class FilesSourceConfig:
    """Local .txt / .jsonl / .parquet files (paths or globs, optionally .gz/.bz2/.xz/.zst); what a
    document is: see data/sources/local_files.py."""

    paths: list[str] = field(default_factory=list)
    format: str = "auto"
    text_column: str = "text"
    encoding_errors: str = "strict"
    txt_document: str = "file"

    def __post_init__(self) -> None:
        check_types(self, "data.files", DataError)
        _require_choice("data.files.format", self.format, FILE_FORMATS)
        _require_choice("data.files.encoding_errors", self.encoding_errors, ENCODING_ERRORS)
        _require_choice("data.files.txt_document", self.txt_document, TXT_DOCUMENTS)


# The synthetic corpus is made in memory, each word of it a few bytes of text twice over (a list,
# then the dataset): this bound keeps it to a few hundred megabytes, far above the induction lab's.
MAX_SYNTHETIC_WORDS = 50_000_000


@dataclass
class SyntheticSourceConfig:
    """Random sequences of made-up words, each written twice (data/sources/synthetic.py): the induction lab's
    corpus. Sequences are ``min_words..max_words`` distinct words from a list of ``words``."""

    seed: int = 0
    documents: int = 20000
    words: int = 256
    min_words: int = 8
    max_words: int = 40

    def __post_init__(self) -> None:
        check_types(self, "data.synthetic", DataError)
        _require(self.documents >= 1, f"data.synthetic.documents must be at least 1, got {self.documents}")
        _require(2 <= self.words <= 10000, f"data.synthetic.words must be between 2 and 10000, got {self.words}")
        _require(1 <= self.min_words <= self.max_words <= self.words,
                 "data.synthetic needs 1 <= min_words <= max_words <= words (a sequence repeats no word), "
                 f"got min_words {self.min_words}, max_words {self.max_words}, words {self.words}")
        most = 2 * self.documents * self.max_words  # each sequence is written twice
        _require(most <= MAX_SYNTHETIC_WORDS,
                 f"data.synthetic asks for up to {most:,} words (2 x documents x max_words), more than the "
                 f"{MAX_SYNTHETIC_WORDS:,} it makes in memory; lower data.synthetic.documents or max_words")


# The quoting corpus is made in memory too: passages up to this many characters (twice each).
MAX_QUOTE_CHARACTERS = 200_000_000


@dataclass
class QuotesSourceConfig:
    """Passages of the plays, each written twice (data/sources/quotes.py): a corpus that teaches a
    model to copy its context. ``passages`` passages of ``min_chars..max_chars`` characters."""

    seed: int = 0
    passages: int = 20000
    min_chars: int = 60
    max_chars: int = 220

    def __post_init__(self) -> None:
        check_types(self, "data.quotes", DataError)
        _require(self.passages >= 1, f"data.quotes.passages must be at least 1, got {self.passages}")
        _require(1 <= self.min_chars <= self.max_chars <= 100_000,
                 "data.quotes needs 1 <= min_chars <= max_chars <= 100000, "
                 f"got min_chars {self.min_chars}, max_chars {self.max_chars}")
        most = 2 * self.passages * self.max_chars  # each passage is written twice
        _require(most <= MAX_QUOTE_CHARACTERS,
                 f"data.quotes asks for up to {most:,} characters (2 x passages x max_chars), more than the "
                 f"{MAX_QUOTE_CHARACTERS:,} it makes in memory; lower data.quotes.passages or max_chars")


# A ceiling on the conversations the calculator set makes in memory (a few hundred bytes each).
MAX_CALCULATOR_CONVERSATIONS = 1_000_000
CALCULATOR_OPERATIONS = "+-*/"


@dataclass
class CalculatorSourceConfig:
    """Conversations that call the built-in calculator (data/sources/tool_arithmetic.py): questions of
    2 to ``max_terms`` operands of ``digits`` digits, joined by ``operations`` (some of ``+-*/``)."""

    seed: int = 0
    conversations: int = 4000
    digits: int = 3
    operations: str = "*"
    max_terms: int = 2

    def __post_init__(self) -> None:
        check_types(self, "data.calculator", DataError)
        check_calculator_problems("data.calculator", "conversations", self.conversations, self.digits,
                                  self.operations, self.max_terms)


def check_calculator_problems(key: str, count_key: str, count: int, digits: int, operations: str, max_terms: int,
                              error: type[Exception] = DataError) -> None:
    """Refuse in one line calculator problems that cannot be drawn: ``count`` of them (``key``.``count_key``)
    of 2 to ``max_terms`` operands of ``digits`` digits joined by ``operations``. Shared by the SFT
    source (``data.calculator``) and the RL task that draws the same problems (``rl.calculator``)."""
    require(1 <= count <= MAX_CALCULATOR_CONVERSATIONS,
            f"{key}.{count_key} must be from 1 to {MAX_CALCULATOR_CONVERSATIONS:,}, got {count}", error)
    require(1 <= digits <= 5, f"{key}.digits must be from 1 to 5, got {digits}", error)
    require(2 <= max_terms <= 4, f"{key}.max_terms must be from 2 to 4, got {max_terms}", error)
    require(operations != "" and set(operations) <= set(CALCULATOR_OPERATIONS),
            f"{key}.operations must be some of {CALCULATOR_OPERATIONS!r}, got {operations!r}", error)
    require("*" not in operations or digits * max_terms <= 15,
            f"{key}: a product of {max_terms} numbers of {digits} digits passes the calculator's limit of "
            f"10**15; lower {key}.digits or max_terms", error)
    numbers = 10**digits - (10 ** (digits - 1) if digits > 1 else 0)
    distinct = sum(numbers**terms * len(set(operations)) ** (terms - 1) for terms in range(2, max_terms + 1))
    require(count <= distinct // 2,
            f"{key}.{count_key} is {count:,}, more than half the {distinct:,} distinct problems its digits, "
            "operations and max_terms make; ask for fewer or widen them", error)


@dataclass
class DataConfig:
    """Where the corpus comes from, how it is split, and the tokenizer trained on it."""

    source: str = "shakespeare"
    # chat: conversations (data/sources/conversations.py); preference: reply pairs
    # (training/tasks/dpo/pairs.py); both for train.init_from
    format: str = "text"
    vocab_size: int = 2048
    val_fraction: float = 0.1
    split_seed: int = 1234
    cache_dir: str = "data_cache"
    hub: HubSourceConfig = field(default_factory=HubSourceConfig)
    files: FilesSourceConfig = field(default_factory=FilesSourceConfig)
    synthetic: SyntheticSourceConfig = field(default_factory=SyntheticSourceConfig)
    quotes: QuotesSourceConfig = field(default_factory=QuotesSourceConfig)
    calculator: CalculatorSourceConfig = field(default_factory=CalculatorSourceConfig)
    # Documents handed to one encode_batch call: large enough to keep every core busy, small
    # enough that a batch of long documents stays well inside memory.
    tokenize_batch_size: int = 1024

    def __post_init__(self) -> None:
        check_types(self, "data", DataError)
        _require(self.source in SOURCES, f"unknown data.source {self.source!r}: use one of {', '.join(SOURCES)}")
        _require_choice("data.format", self.format, FORMATS)
        _require(self.source != "calculator" or self.format == "chat",
                 "data.source calculator makes conversations that call the calculator: use it with data.format: chat")
        _require(self.format != "chat" or self.source in CHAT_SOURCES,
                 f"data.source {self.source} makes text, not conversations, so data.format: chat cannot read it; "
                 f"use data.source {', '.join(CHAT_SOURCES[:-1])} or {CHAT_SOURCES[-1]}, or data.format: text")
        # The 256 byte symbols and the special tokens (data/tokenizer.py) are the smallest vocabulary
        # the tokenizer trainer makes; uint32 token files cap it far above anything trained here.
        _require(MIN_VOCAB_SIZE <= self.vocab_size <= 2**32 - 1,
                 f"data.vocab_size must be from {MIN_VOCAB_SIZE} (256 byte symbols and "
                 f"{MIN_VOCAB_SIZE - 256} special tokens) to {2**32 - 1:,} (the token files' uint32), "
                 f"got {self.vocab_size}")
        _require(0.0 < self.val_fraction < 1.0,
                 f"data.val_fraction must be between 0 and 1 (exclusive), got {self.val_fraction}")
        _require(self.cache_dir != "", "data.cache_dir must not be empty; e.g. data_cache")
        _require(self.tokenize_batch_size >= 1, "data.tokenize_batch_size must be a positive integer")
        _require(self.source != "hub" or self.hub.name != "",
                 "data.source is 'hub' but data.hub.name is empty: set it to a hub dataset "
                 "(e.g. roneneldan/TinyStories) or a local dataset directory")
        _require(self.format != "preference" or self.source in ("files", "hub"),
                 f"data.format: preference reads reply pairs from data.source files or hub, not {self.source!r}; "
                 "build the built-in set from a chat run with python -m training.tasks.dpo.preference_set")
        _require(self.source != "files" or self.files.paths != [],
                 "data.source is 'files' but data.files.paths is empty: list .txt, .jsonl or "
                 ".parquet paths or globs")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DataConfig:
        """Build from a plain dict (e.g. parsed YAML); unknown keys are errors, not ignored."""
        return build(cls, d, "data", DataError)


def _require(condition: bool, message: str) -> None:
    require(condition, message, DataError)


def _require_choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    _require(value in choices, f"{key} must be one of {', '.join(choices)}, got {value!r}")
