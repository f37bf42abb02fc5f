"""From a corpus to what training reads: tokenizer, token files, batches and bits per byte.

    cfg = DataConfig(source="shakespeare", vocab_size=2048)      # data.config
    data = prepare_data(cfg)                                     # data.prepared.text: cached; only the main process builds
    batches = TrainBatches(data.train_tokens(), block_size, batch_size, seed=1, rank=rank)   # data.batches.text
    x, y = batches.next()

Nothing is imported here: each module is imported by name, and a run loads only what it reads."""
