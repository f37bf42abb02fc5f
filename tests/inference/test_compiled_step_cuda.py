"""The compiled decode step on a GPU, where it replays as a CUDA graph (mode ``reduce-overhead``):
the same tokens as the eager path and as full recomputation, across the window's slide, and one
graph for a generation of any length. CI has no GPU, so these skip there; they run on a lent GPU
machine (docs/results.md, "A GPU: small.yaml and the compiled decode step")."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from inference.completion import generate_completions
from inference.engine import Engine, Finish, decode
from inference.settings import GenerationSettings
from model import GPT, GPTConfig
from model.generation import SamplingSettings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROMPT_IDS = [5, 17, 9, 30, 2, 11]
LONG = 120  # past the test model's block_size (32) several times: the window slides and re-encodes


@pytest.fixture(scope="module")
def cuda_run(run_dir):
    from rundir.loading import load_run

    return load_run(run_dir, torch.device("cuda"))


def completions(run, **settings) -> list[list[int]]:
    result = generate_completions(run, PROMPT_IDS, GenerationSettings(**settings))
    return [completion.token_ids for completion in result.completions]


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=3)])
def test_cuda_graph_tokens_equal_eager_and_the_recomputation(cuda_run, sampling):
    compiled = completions(cuda_run, max_new_tokens=LONG, compile=True, **sampling)
    eager = completions(cuda_run, max_new_tokens=LONG, **sampling)
    recomputed = completions(cuda_run, max_new_tokens=LONG, use_cache=False, **sampling)
    assert len(set(compiled[0])) > 20  # a model stuck on one token would prove nothing
    assert compiled == eager == recomputed


def served(engine: Engine, requests: list[tuple[list[int], SamplingSettings]]) -> list[Finish]:
    finishes: dict[int, Finish] = {}
    for i, (ids, settings) in enumerate(requests):
        engine.submit(ids, settings, lambda event, i=i: finishes.setdefault(i, event.finish) if event.finish else None,
                      logprobs=3)
    engine.run_until_idle()
    return [finishes[i] for i in range(len(requests))]


def test_a_long_cuda_generation_replays_one_graph(cuda_run):
    engine = Engine(cuda_run.model, max_batch=1, batch_invariant=False, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    [finish] = served(engine, [(PROMPT_IDS, SamplingSettings(max_new_tokens=3 * LONG, temperature=0))])
    assert finish.completion_tokens == 3 * LONG
    assert counters["stats"]["unique_graphs"] == graphs  # every length, slide included, reused the graph
    assert engine.compiled.compile_seconds > 0


def test_a_cuda_graph_server_row_equals_the_request_alone(cuda_run):
    engine = Engine(cuda_run.model, max_batch=3, compile=True)  # batch-invariant, as the server builds it
    mine = (PROMPT_IDS, SamplingSettings(max_new_tokens=50, temperature=0.8, seed=11))
    others = [([7, 8, 9], SamplingSettings(max_new_tokens=20, temperature=1.0, seed=1)),
              ([3] * 20, SamplingSettings(max_new_tokens=70, temperature=0.0))]
    [alone] = served(engine, [mine])
    together = served(engine, [others[0], mine, others[1]])[1]
    assert together.token_ids == alone.token_ids
    assert together.logprobs == alone.logprobs  # the same bits: a replayed graph's outputs are copied out


def test_a_cuda_graph_latent_attention_model_decodes_as_eager():
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_kv_head=4, n_embd=64,
                       attention="mla", kv_latent_dim=32)
    model = GPT(config).eval().cuda()
    settings = SamplingSettings(max_new_tokens=LONG, temperature=0.9, seed=1)
    [eager] = decode(model, [PROMPT_IDS], settings)
    [compiled] = decode(model, [PROMPT_IDS], settings, compile=True)
    assert compiled.token_ids == eager.token_ids and len(set(eager.token_ids)) > 20
