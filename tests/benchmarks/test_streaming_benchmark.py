"""benchmarks.streaming's scoring, on cases with a known answer: within the window the rolling
cache, re-encoding and the reference recomputation predict the same stream (the same bits/byte);
past it a two-layer model's rolling cache is not the reference, and no cache ever holds more than
the window. And a learned run is refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.streaming import main, score_stream
from inference.sampling import Window
from model import GPT, GPTConfig
from run_testkit import build_run, chat_tokenizer

BLOCK = 16
VOCAB = 53


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


def tiny_model(positions: str, attention: str = "gqa") -> GPT:
    torch.manual_seed(0)
    latent = dict(attention="mla", n_kv_head=4, kv_latent_dim=32) if attention == "mla" else dict(n_kv_head=2)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, n_embd=64, positions=positions,
                          **latent)).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.normal_(0.0, 1.0 / math.sqrt(param.shape[1]))
    return model


def stream(length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(1)).tolist()


def ways(model: GPT, ids: list[int]) -> dict:
    token_bytes = [0] + [1 + i % 3 for i in range(1, VOCAB)]  # id 0 stands for end-of-text: never scored
    positions = model.config.positions
    windows = {"reference": (Window.for_positions(positions, BLOCK, keep_fraction=1.0, roll=False), False),
               "rolling": (Window.for_positions(positions, BLOCK), True),
               "re-encode": (Window.for_positions(positions, BLOCK, roll=False), True)}
    return {name: score_stream(model, ids, token_bytes, window, use_cache=cached, name=name)
            for name, (window, cached) in windows.items()}


@pytest.mark.parametrize("kind", [("rope", "gqa"), ("none", "gqa"), ("rope", "mla")], ids="-".join)
def test_within_the_window_every_way_is_the_reference(kind):
    model = tiny_model(*kind)
    ids = stream(BLOCK)
    scores = ways(model, ids)
    reference = scores["reference"]
    with torch.inference_mode():  # the reference's own sum, from one plain forward pass
        logprobs = torch.log_softmax(model(torch.tensor([ids[:-1]]))[0], dim=-1)
    expected = [-float(logprobs[i, t]) for i, t in enumerate(ids[1:]) if t != 0]
    torch.testing.assert_close(torch.tensor(reference.nats), torch.tensor(expected), rtol=0, atol=1e-5)
    for score in scores.values():
        torch.testing.assert_close(torch.tensor(score.nats), torch.tensor(reference.nats), rtol=0, atol=1e-5)
        assert score.bits_per_byte == pytest.approx(reference.bits_per_byte, abs=1e-6)


@pytest.mark.parametrize("positions", ["rope", "none"])
def test_past_the_window_the_rolling_cache_is_not_the_reference_and_holds_one_window(positions):
    model = tiny_model(positions)
    scores = ways(model, stream(4 * BLOCK))
    rolling, reference = scores["rolling"], scores["reference"]
    inside = BLOCK - 1  # targets predicted before the first slide: the same there
    torch.testing.assert_close(torch.tensor(rolling.nats[:inside]), torch.tensor(reference.nats[:inside]),
                               rtol=0, atol=1e-5)
    assert max(abs(a - b) for a, b in zip(rolling.nats[inside:], reference.nats[inside:])) > 1e-2
    assert len(rolling.held) == 3 and max(rolling.held) <= BLOCK and min(rolling.held) >= Window.for_positions(
        positions, BLOCK).keep - 1


def test_a_learned_run_is_refused_in_one_line(tmp_path, capsys):
    run = build_run(tmp_path / "learned", chat_tokenizer())
    assert main(["--run", str(run)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {run} has learned positions"), err
