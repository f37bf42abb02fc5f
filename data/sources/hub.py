"""A Hugging Face hub dataset (or a local directory laid out like one) as a corpus source: the same
`datasets.load_dataset` call reads both, so the offline tests exercise the real path."""

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import urlsplit

from tqdm import tqdm

from common.errors import DataError, one_line
from data.config import DataConfig, HubSourceConfig
from data.sources.documents import SourceDocuments, check_text_column, file_identity, find_cause, row_ids, text_only


def spec(cfg: DataConfig) -> dict[str, Any]:
    """What decides the documents, for the cache key (no network, no `datasets`)."""
    hub = cfg.hub
    spec: dict[str, Any] = {"type": "hub", **hub.model_dump()}
    del spec["streaming"]  # it changes how the documents are read, not which ones
    # A local dataset directory can change under the same name; its files are the identity.
    root = Path(hub.name).expanduser()
    if root.is_dir():
        spec["local_files"] = [file_identity(p, root) for p in sorted(root.rglob("*")) if p.is_file()]
    return spec


def load(cfg: DataConfig, progress: bool) -> SourceDocuments:
    """Read the training split (and the validation split when the dataset has one), capped."""
    hub, val_fraction = cfg.hub, cfg.val_fraction
    description = f"hub dataset {hub.name}" + (f" ({hub.config_name})" if hub.config_name else "")
    has_val = hub_has_val_split(hub, description)
    train_docs, val_docs = _share(hub.max_documents, val_fraction, has_val)
    train_bytes, val_bytes = _share(hub.max_bytes, val_fraction, has_val)
    train, train_ids = _load_hub_split(hub, hub.train_split, train_docs, train_bytes, progress)
    if not has_val:
        return SourceDocuments(description, train, train_ids)
    val, val_ids = _load_hub_split(hub, hub.val_split, val_docs, val_bytes, progress)
    return SourceDocuments(description, train, train_ids, val, val_ids, val_split=hub.val_split)


def _share(cap: int | None, val_fraction: float, has_val: bool) -> tuple[int | None, int | None]:
    if cap is None or not has_val:
        return cap, None
    val = max(1, round(cap * val_fraction))
    return max(1, cap - val), val


def _load_hub_split(
    hub: HubSourceConfig, split: str, max_docs: int | None, max_bytes: int | None, progress: bool
) -> tuple[Any, list[str]]:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    with hub_errors_explained(hub.name):
        dataset = datasets.load_dataset(hub.name, hub.config_name, split=split, streaming=hub.streaming)
        if hub.streaming:
            # A streamed slice is read once and kept in memory: its size is the user's cap.
            return _take_streamed(dataset, hub, split, max_docs, max_bytes, progress)
    check_text_column(dataset, hub.text_column, f"hub dataset {hub.name}", "data.hub.text_column")
    count = _count_within_caps(dataset, hub.text_column, max_docs, max_bytes)
    if count < len(dataset):
        dataset = dataset.select(range(count))
    return text_only(dataset, hub.text_column), row_ids(dataset)


def _take_streamed(
    dataset: Any, hub: HubSourceConfig, split: str, max_docs: int | None, max_bytes: int | None,
    progress: bool,
) -> tuple[Any, list[str]]:
    import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

    texts: list[str] = []
    ids: list[str] = []
    total_bytes = 0
    with tqdm(desc=f"reading {hub.name} [{split}]", unit="doc", total=max_docs, disable=not progress) as bar:
        for row in dataset:
            if not texts:
                check_text_column(row, hub.text_column, f"hub dataset {hub.name}", "data.hub.text_column")
            text = row[hub.text_column] or ""
            ids.append(str(row["id"]) if "id" in row else str(len(texts)))
            texts.append(text)
            total_bytes += len(text.encode("utf-8"))
            bar.update(1)
            if (max_docs is not None and len(texts) >= max_docs) or (
                max_bytes is not None and total_bytes >= max_bytes
            ):
                break
    return datasets.Dataset.from_dict({"text": texts}), ids


def _count_within_caps(dataset: Any, column: str, max_docs: int | None, max_bytes: int | None) -> int:
    """How many leading documents fit the caps (whole documents, until a cap is reached)."""
    count = len(dataset) if max_docs is None else min(max_docs, len(dataset))
    if max_bytes is None:
        return count
    total = seen = 0
    for batch in dataset.select_columns([column]).select(range(count)).iter(batch_size=1000):
        for text in batch[column]:
            seen += 1
            total += len((text or "").encode("utf-8"))
            if total >= max_bytes:
                return seen
    return count


def hub_has_val_split(hub: HubSourceConfig, description: str) -> bool:
    """Whether the dataset has the split ``data.hub.val_split``; first the checks that fail fast (a
    loading script, an unreachable hub), before ``datasets`` is imported."""
    root = Path(hub.name).expanduser()
    scripts = sorted(root.glob("*.py")) if root.is_dir() else []
    if scripts:
        raise DataError(
            f"local dataset directory {root} has a loading script ({scripts[0]}), which datasets no longer "
            "runs; point data.hub.name at a directory of data files, or use data.source: files"
        )
    with hub_errors_explained(hub.name):
        check_hub_reachable(hub.name)
        import datasets  # slow to import (docs/results.md): loaded only once a corpus is read

        splits = datasets.get_dataset_split_names(hub.name, hub.config_name)
    if hub.train_split not in splits:
        raise DataError(
            f"{description} has no split {hub.train_split!r} (it has {', '.join(splits)}): "
            "set data.hub.train_split"
        )
    return hub.val_split in splits


@contextlib.contextmanager
def hub_errors_explained(name: str) -> Iterator[None]:
    """Turn hub failures into one-line DataErrors that say what to do."""
    try:
        yield
    except DataError:
        raise
    except (ConnectionError, TimeoutError) as exc:
        raise DataError(
            f"cannot reach hub dataset {name!r}: a network problem, not a missing dataset (this machine "
            f"is offline or the hub is unreachable: {one_line(exc)}). "
            f"Download it where there is a network (hf download {name} --repo-type dataset "
            "--local-dir DIR) and set data.hub.name to DIR, or use data.source: files with local "
            ".txt/.jsonl/.parquet files"
        ) from exc
    except FileNotFoundError as exc:
        raise DataError(
            f"hub dataset {name!r} not found ({one_line(exc)}): check data.hub.name, or point it "
            "at a local dataset directory"
        ) from exc
    except Exception as exc:
        # ValueError (unknown config or split), HTTP errors, and datasets' own generation errors,
        # whose first line is generic: report the innermost cause.
        import datasets.exceptions

        if not isinstance(exc, (ValueError, OSError, datasets.exceptions.DatasetsError)):
            raise
        cause = find_cause(exc, Exception) or exc
        raise DataError(f"cannot load hub dataset {name!r}: {one_line(cause)}") from exc


# A fast check that the Hugging Face hub can be reached, before ``datasets`` spends tens of seconds
# of retries: one TCP connection, its timeout covering the DNS lookup too.
DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0


def offline_mode() -> bool:
    """True when the user asked the Hugging Face libraries to stay offline."""
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def check_hub_reachable(name: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raise ConnectionError when ``name`` needs the hub and its endpoint cannot be reached (local
    directories and offline mode are not probed)."""
    if Path(name).expanduser().is_dir() or offline_mode():
        return
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    outcome: list[BaseException | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout_s).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(e)

    # getaddrinfo ignores socket timeouts; a daemon thread bounds the lookup as well.
    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout_s + 0.5)
    if not outcome:
        raise ConnectionError(f"no answer from {host}:{port} within {timeout_s:g} s")
    if outcome[0] is not None:
        raise ConnectionError(f"cannot connect to {host}:{port} ({outcome[0]})")
