"""The trainer's validation numbers, recomputed by hand over the same windows."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from data.tokenizer import EOT, train_tokenizer
from inference.engine import decode
from inference.sampling import SamplingSettings
from model.config import GPTConfig
from model.gpt import GPT
from training.evaluate import evaluate, generate_sample


def test_full_pass_loss_and_bits_per_byte_match_a_hand_computation() -> None:
    torch.manual_seed(0)
    block = 8
    model = GPT(GPTConfig(vocab_size=17, block_size=block, n_layer=1, n_head=2, n_kv_head=1, n_embd=16)).eval()
    rng = np.random.default_rng(0)
    val = rng.integers(0, 17, size=5 * block + 3).astype(np.uint16)
    val[::7] = 0  # token 0 plays end-of-text: scored in the loss, no bytes, left out of bits/byte
    token_bytes = torch.tensor([0] + [1 + i % 4 for i in range(16)], dtype=torch.int64)

    result = evaluate(model, val, token_bytes, block_size=block, batch_size=2, max_batches=None,
                      device=torch.device("cpu"))
    nats_all, count, text_nats, text_bytes = 0.0, 0, 0.0, 0
    with torch.no_grad():
        for start in range(0, (len(val) - 1) // block * block, block):  # non-overlapping windows
            window = torch.from_numpy(val[start:start + block + 1].astype(np.int64))
            x, y = window[:-1][None], window[1:]
            nats = F.cross_entropy(model(x)[0], y, reduction="none").double()
            nats_all += nats.sum().item()
            count += y.numel()
            text = token_bytes[y] > 0
            text_nats += nats[text].sum().item()
            text_bytes += token_bytes[y].sum().item()
    assert result.tokens == count == 5 * block and result.bytes == text_bytes
    assert abs(result.loss - nats_all / count) < 1e-5
    assert abs(result.bpb - text_nats / math.log(2) / text_bytes) < 1e-5


def test_a_sample_is_one_document_ending_where_the_model_ends_it() -> None:
    tokenizer = train_tokenizer(["ab ba abba baab " * 20] * 4, 270)
    eot, a = tokenizer.token_to_id(EOT), tokenizer.token_to_id("a")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tokenizer.get_vocab_size(), block_size=32, n_layer=1, n_head=2, n_kv_head=1,
                          n_embd=16)).eval()
    # Only "a" and end-of-text can be drawn, at nearly even odds, so the sample's end is plain to see.
    others = tuple(i for i in range(tokenizer.get_vocab_size()) if i not in (eot, a))
    settings = SamplingSettings(max_new_tokens=24, temperature=50.0, top_k=None, top_p=None, seed=4,
                                suppress_ids=others)
    prompt = tokenizer.encode("ab").ids
    free, = decode(model, [prompt], settings)  # the same draws, with nothing ending them
    ids = list(free.token_ids)
    assert eot in ids and ids.index(eot) > 0  # the case this test is for: a document ends mid-sample
    sample = generate_sample(model, tokenizer, "ab", settings)
    assert sample == "ab" + "a" * ids.index(eot) and EOT not in sample
    # An unconditional sample starts from end-of-text alone, which is not text either.
    assert EOT not in generate_sample(model, tokenizer, "", settings)
