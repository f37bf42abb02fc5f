"""Latent attention runs served (learned and rotary positions; grouped-query runs with rotary or no
positions too): each request equals itself alone, bit for bit, and generate.py, in the engine and
through the OpenAI client."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.completion import generate_completions
from inference.sampling import SamplingSettings
from inference.settings import GenerationSettings
from rundir.loading import load_run
from run_testkit import MLA_OPTIONS, build_run, chat_tokenizer
from server_process import running_server
from inference.engine import Engine
from test_engine import api_settings, serve_all

openai = pytest.importorskip("openai")


MLA = dict(n_kv_head=4, attention="mla", kv_latent_dim=32, q_latent_dim=16)
# The cached vector a multiple of 16: the CPU condition for batch-invariant decoding (model.gpt.LatentAttention).
# With rotary positions it holds the latent and the rotary key (half of head_dim 16) beside it.
KINDS = {"plain": MLA | MLA_OPTIONS, "rope": MLA | dict(kv_latent_dim=24, positions="rope"),
         "gqa-rope": dict(positions="rope"), "gqa-none": dict(positions="none")}


# No positions serves through the grouped-query path the rotary run covers: with the slow tests.
@pytest.fixture(scope="module", params=[pytest.param(k, marks=pytest.mark.e2e) if k == "gqa-none" else k
                                        for k in KINDS])
def mla_run_dir(request, tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("runs") / "mla", chat_tokenizer(), **KINDS[request.param])


@pytest.fixture(scope="module")
def mla_run(mla_run_dir):
    return load_run(mla_run_dir, torch.device("cpu"))


def requests(run) -> list[tuple[list[int], SamplingSettings]]:
    """Prompts from 1 token to the whole window, some generating past it (the window slides)."""
    g = torch.Generator().manual_seed(5)
    lengths, new = [1, 4, 13, 31, 32, 7], [20, 45, 9, 70, 3, 40]
    return [(torch.randint(5, len(run.token_bytes), (n,), generator=g).tolist(),
             api_settings(m, temperature=[0.0, 0.9, 1.3][i % 3], top_p=[1.0, 0.8][i % 2], seed=40 + i))
            for i, (n, m) in enumerate(zip(lengths, new))]


def reference(run, prompt, params: SamplingSettings) -> list[int]:
    """generate.py's tokens, decoded in the server's arithmetic."""
    settings = GenerationSettings(max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                                  top_k=None, top_p=params.top_p, seed=params.seed)
    return generate_completions(run, prompt, settings, batch_invariant=True).completions[0].token_ids


def test_each_served_request_equals_its_solo_run_and_generate_py(mla_run):
    batch = requests(mla_run)
    with Engine(mla_run.model, mla_run.token_bytes, max_batch=4, prefill_chunk=8) as engine:
        together = [c.finish.token_ids for c in serve_all(engine, batch)]
        alone = [serve_all(engine, [request])[0].finish.token_ids for request in batch]
    for i, (request, mixed, solo) in enumerate(zip(batch, together, alone)):
        assert mixed == solo, f"request {i}"
        assert list(solo) == reference(mla_run, *request), f"request {i} against generate.py"


# The engine test above proves every kind; over a socket, one kind by default (a server start
# costs seconds), the others with the slow tests.
@pytest.mark.parametrize("mla_run_dir", [kind if kind == "rope" else pytest.param(kind, marks=pytest.mark.e2e)
                                         for kind in KINDS], indirect=True)
def test_concurrent_completions_over_a_socket_equal_generate_py(mla_run_dir, mla_run):
    prompts = ["ROMEO: But soft", "Café 😀", "JULIET: O", "The quick brown fox"]
    with running_server(mla_run_dir, "--max-batch", "4") as server:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0, timeout=60)

        def complete(i):
            return client.completions.create(model="mla", prompt=prompts[i], max_tokens=24, temperature=0.8,
                                             seed=i, stop=None).choices[0].text

        with ThreadPoolExecutor(len(prompts)) as pool:
            texts = list(pool.map(complete, range(len(prompts))))
    for i, (prompt, text) in enumerate(zip(prompts, texts)):
        ids = mla_run.tokenizer.encode(prompt).ids
        expected = reference(mla_run, ids, api_settings(24, temperature=0.8, seed=i))
        if mla_run.eot_id in expected:  # the server stops at <|endoftext|>
            expected = expected[:expected.index(mla_run.eot_id)]
        assert text == mla_run.tokenizer.decode(expected, skip_special_tokens=False), f"prompt {i}"
