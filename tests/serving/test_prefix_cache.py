"""The prefix cache: a hit skips prefill and changes no token, bit for bit; it stays within its bound.
The model's arithmetic depends on how a prompt is cut into chunks (checked below), so a hit that
skipped the wrong chunks would show in the exactly compared log-probabilities."""

import gc
import random
import tracemalloc

import httpx
import pytest
import torch

from rundir.loading import load_run
from server_process import rss_bytes, running_server
from run_testkit import build_run, chat_tokenizer
from inference.engine import Engine
from inference.prefix_cache import PrefixCache, page_cost
from test_engine import Collector, api_settings

BLOCK = 256
PAGE = 32
SYSTEM = 100  # tokens of a system prompt every conversation shares
TURNS = 3


@pytest.fixture(scope="module")
def wide_run_dir(tmp_path_factory):
    return build_run(tmp_path_factory.mktemp("runs") / "wide-context", chat_tokenizer(), block_size=BLOCK)


@pytest.fixture(scope="module")
def wide_run(wide_run_dir):
    return load_run(wide_run_dir, torch.device("cpu"))


@pytest.fixture(scope="module")
def wide_mla_run(tmp_path_factory):
    """Multi-head latent attention: the cache's one entry is a latent, not K and V."""
    directory = build_run(tmp_path_factory.mktemp("runs") / "wide-mla", chat_tokenizer(), block_size=BLOCK,
                          n_kv_head=4, attention="mla", kv_latent_dim=32, q_latent_dim=16)
    return load_run(directory, torch.device("cpu"))


def engine(run, *, max_batch=1, prefix_cache_bytes=0, prefill_chunk=PAGE) -> Engine:
    return Engine(run.model, run.token_bytes, max_batch=max_batch, prefill_chunk=prefill_chunk,
                  prefix_cache_bytes=prefix_cache_bytes)


def serve_one(eng: Engine, prompt, params) -> Collector:
    """Serve one request by driving the loop by hand."""
    collect = Collector()
    eng.submit(prompt, params, collect, logprobs=5)
    while not collect.done.is_set():
        eng.step()
    return collect


def conversations(run, clients: int = 3) -> list[list[tuple[list[int], object]]]:
    """Each client's turns, (prompt, settings): each resends the last prompt and its reply (served with
    no cache) and a new message, as an OpenAI chat client does."""
    g = torch.Generator().manual_seed(5)
    vocab = len(run.token_bytes)

    def words(n):
        return torch.randint(5, vocab, (n,), generator=g).tolist()

    system = words(SYSTEM)
    reference = engine(run)
    turns = []
    for client in range(clients):
        history, mine = system + words(20 + client), []
        for turn in range(TURNS):
            params = api_settings(12, temperature=[0.0, 0.9][turn % 2], seed=100 * client + turn)
            mine.append((list(history), params))
            reply = serve_one(reference, history, params).finish.token_ids
            history = history + list(reply) + words(40)
        turns.append(mine)
    assert max(len(prompt) for client in turns for prompt, _ in client) <= BLOCK
    return turns


def test_pages_from_position_0_and_the_least_recently_used_go_first_within_the_bound():
    cache = PrefixCache(page=4, max_bytes=10**6)
    tokens = list(range(20))
    cache.store(tokens[:4], {"k": torch.zeros(1, 1, 4, 2)})
    cache.store(tokens[:8], {"k": torch.ones(1, 1, 4, 2)})
    assert len(cache.lookup(tokens)) == 2
    assert len(cache.lookup(tokens[:8])) == 1  # the 8th token must be computed for its logits
    assert len(cache.lookup([99] + tokens[1:])) == 0  # the same page after another first token
    assert torch.equal(cache.lookup(tokens[:9])[1]["k"], torch.ones(1, 1, 4, 2))
    # Memory is bounded, and the least recently used page goes first, before the pages it begins.
    page_bytes = page_cost(4, 4 * 2 * 4)  # one fp32 entry of (1 layer, 1 head, 4 positions, 2 dims)
    cache = PrefixCache(page=4, max_bytes=3 * page_bytes)
    a, b = list(range(100, 112)), list(range(200, 212))
    for end in (4, 8):
        cache.store(a[:end], {"latent": torch.zeros(1, 1, 4, 2)})  # any entry name works
    cache.store(b[:4], {"latent": torch.zeros(1, 1, 4, 2)})
    assert len(cache) == 3 and cache.nbytes <= 3 * page_bytes
    cache.lookup(a)  # a's pages are now newer than b's
    cache.store(a[:12], {"latent": torch.zeros(1, 1, 4, 2)})
    assert cache.nbytes <= 3 * page_bytes and len(cache.lookup(b + [0])) == 0
    assert len(cache.lookup(a + [0])) == 3
    cache.store(b[:4], {"latent": torch.zeros(1, 1, 4, 2)})  # evicts a's last page, never its first
    assert len(cache.lookup(a + [0])) == 2


def tensors_held(root) -> list[torch.Tensor]:
    """Every tensor reachable from ``root`` through Python containers and objects."""
    seen, found, stack = set(), [], [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (int, str, bytes, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        else:
            stack.extend(gc.get_referents(obj))
    return found


@pytest.mark.parametrize("page", [1, 8])
def test_what_the_cache_holds_stays_within_its_bound(page):
    """Measured, not the cache's own count: every tensor storage it references, and every Python byte it
    keeps (tracemalloc)."""
    bound = 2**20
    entries = {"k": torch.randn(2, 2, page, 16), "v": torch.randn(2, 2, page, 16)}
    cache = PrefixCache(page, bound)
    generator = random.Random(0)
    # What the session made before this test is neither the cache's nor garbage it makes: frozen,
    # each collection below walks only what the test allocates, not the whole suite's heap.
    gc.freeze()
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for check in range(4):
            for _ in range(6):
                prompt = [generator.randrange(1000, 50000) for _ in range(60 * page)]  # ints no one else keeps
                for end in range(page, len(prompt) + 1, page):
                    cache.store(prompt[:end], entries)
            del prompt
            gc.collect()
            python = tracemalloc.get_traced_memory()[0] - start
            storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors_held(cache)}
            assert sum(storages.values()) + python <= bound
    finally:
        tracemalloc.stop()
        gc.unfreeze()
    assert sum(storages.values()) + python > 0.8 * bound and len(cache) > 100  # it filled up, and no further
    assert cache.nbytes <= bound


def test_this_model_gives_other_bits_when_a_prompt_is_cut_into_other_chunks(wide_run):
    """The control: the exact comparisons below can fail on this model, with these prompts."""
    differ = 0
    for client in conversations(wide_run):
        for prompt, params in client:
            grid = serve_one(engine(wide_run), prompt, params).finish.logprobs
            other = serve_one(engine(wide_run, prefill_chunk=48), prompt, params).finish.logprobs
            differ += grid != other
    assert differ > 0


@pytest.mark.parametrize("attention", ["gqa", "mla"])
def test_hits_skip_prefill_and_change_no_token_nor_logprob_bit(request, attention):
    wide_run = request.getfixturevalue({"gqa": "wide_run", "mla": "wide_mla_run"}[attention])
    turns = conversations(wide_run)
    solo = [[serve_one(engine(wide_run), *turn).finish for turn in client] for client in turns]

    cached = engine(wide_run, prefix_cache_bytes=2**30)
    served = [[serve_one(cached, *turn).finish for turn in client] for client in turns]
    computed_with_hits = cached.prefill_tokens

    for client, (client_turns, client_solo, client_served) in enumerate(zip(turns, solo, served)):
        for turn, (alone, hit) in enumerate(zip(client_solo, client_served)):
            assert hit.token_ids == alone.token_ids and hit.text == alone.text
            assert hit.logprobs == alone.logprobs  # every float, bit for bit
            # The whole pages of the system prompt (the first client found none), or of the turn
            # before: its reply was decoded, not prefilled, so its page is computed now.
            if turn == 0:
                expected = 0 if client == 0 else PAGE * (SYSTEM // PAGE)
            else:
                expected = PAGE * (len(client_turns[turn - 1][0]) // PAGE)
            assert (alone.cached_tokens, hit.cached_tokens) == (0, expected)
    total = sum(f.prompt_tokens for client in solo for f in client)
    assert computed_with_hits == total - sum(f.cached_tokens for client in served for f in client)
    assert computed_with_hits < total / 2


def test_concurrent_conversations_with_a_small_cache_still_equal_their_solo_runs(wide_run):
    """Rows prefilling side by side share pages, and a small cache evicts all the time: no token changes."""
    turns = conversations(wide_run, clients=4)
    page_bytes = engine(wide_run).cache.nbytes() // BLOCK * PAGE  # one row's page
    solo = [serve_one(engine(wide_run), *turn).finish for client in turns for turn in client]
    for budget in (3 * page_bytes, 2**30):
        with engine(wide_run, max_batch=4, prefix_cache_bytes=budget) as eng:
            together = []
            for turn in range(TURNS):  # each turn of every client at once, as chat clients would
                collectors = [Collector() for _ in turns]
                for client, collect in zip(turns, collectors):
                    eng.submit(*client[turn], collect, logprobs=5)
                for collect in collectors:
                    assert collect.done.wait(120)
                together.append([c.finish for c in collectors])
            assert eng.prefix_cache.nbytes <= budget
        by_client = [together[turn][client] for client in range(len(turns)) for turn in range(TURNS)]
        for alone, mixed in zip(solo, by_client):
            assert (mixed.token_ids, mixed.logprobs) == (alone.token_ids, alone.logprobs)
        assert sum(f.cached_tokens for f in by_client) > 0


def test_the_server_reports_cached_tokens_as_openai_does(wide_run_dir, wide_run):
    openai = pytest.importorskip("openai")
    prompt = "ROMEO: But soft, what light through yonder window breaks? It is the east. " * 3
    length = len(wide_run.tokenizer.encode(prompt).ids)
    with running_server(wide_run_dir, "--prefix-cache-mb", "64") as served:
        client = openai.OpenAI(base_url=f"{served.base}/v1", api_key="x", max_retries=0, timeout=60)
        replies = [client.completions.create(model="wide-context", prompt=prompt, max_tokens=8, temperature=0.9,
                                             seed=4) for _ in range(2)]
    assert replies[0].choices[0].text == replies[1].choices[0].text
    cached = [r.usage.prompt_tokens_details.cached_tokens for r in replies]
    assert cached == [0, PAGE * ((length - 1) // PAGE)]


@pytest.mark.e2e
def test_a_server_with_one_token_pages_grows_by_about_its_bound(wide_run_dir):
    """Once it grew by forty times its bound: one-token pages, 40 distinct prompts; the server may grow by
    the bound and as much again for everything else a request touches."""
    bound_mb = 4
    generator = random.Random(1)
    with running_server(wide_run_dir, "--prefill-chunk", "1", "--prefix-cache-mb", str(bound_mb),
                        "--max-batch", "1") as served:
        def ask(ids):
            response = httpx.post(f"{served.base}/v1/completions", timeout=120,
                                  json={"model": "wide-context", "prompt": ids, "max_tokens": 1})
            assert response.status_code == 200, response.text

        ask([5] * (BLOCK - 6))  # warm up: the first request's allocations are not the cache's
        before = rss_bytes(served.process.pid)
        for _ in range(40):
            ask([generator.randrange(1, 256) for _ in range(BLOCK - 6)])
        grown = rss_bytes(served.process.pid) - before
    assert grown <= 2 * bound_mb * 2**20, f"grew by {grown / 2**20:.1f} MB"
