"""From a corpus to what training reads: tokenizer, token files, batches and bits per byte.

    cfg = DataConfig(source="shakespeare", vocab_size=2048)
    data = prepare_data(cfg)                       # cached; only the main process builds
    batches = TrainBatches(data.train_tokens(), block_size, batch_size, seed=1, rank=rank)
    x, y = batches.next()
"""

from data.batches.text import EpochBatches, TrainBatches, iter_val_batches, train_batches
from data.config import DataConfig, FilesSourceConfig, HubSourceConfig, SyntheticSourceConfig
from data.errors import DataError
from data.metrics import bits_per_byte, target_nats_and_bytes
from data.prepared.text import PreparedData, prepare_data
from data.tokenizer import EOT, load_tokenizer, token_byte_lengths

__all__ = [
    "DataConfig", "HubSourceConfig", "FilesSourceConfig", "SyntheticSourceConfig", "DataError", "prepare_data", "PreparedData",
    "load_tokenizer", "token_byte_lengths", "EOT", "TrainBatches", "EpochBatches", "train_batches",
    "iter_val_batches", "bits_per_byte", "target_nats_and_bytes",
]
