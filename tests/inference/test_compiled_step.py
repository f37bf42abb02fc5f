"""The compiled decode step (``--compile``: AOTInductor on the CPU, a CUDA graph on a GPU) against eager:
the same tokens, log-probabilities within a stated fp32 bound, one compilation for any length.
Compiling costs seconds, so the default tests share one shape built once per session
(tests/conftest.py); the batch-invariant shapes, other models and attention kinds are e2e."""

import threading

import pytest
import torch
from torch._dynamo.utils import counters

from inference.chat import ChatSession
from inference.cli import main
from inference.compiled_step import compiler_missing
from inference.completion import generate_completions
from inference.engine import Engine, Event, Finish, decode
from inference.sampling import SamplingSettings
from inference.settings import GenerationSettings
from model.config import GPTConfig
from model.gpt import GPT
from refusal_testkit import one_error_line
from rundir.loading import load_run
from test_speculative import serve

pytestmark = pytest.mark.skipif(compiler_missing(torch.device("cpu")) is not None,
                                reason=str(compiler_missing(torch.device("cpu"))))
# The tests that take ``device`` run on the CPU and, where there is one, on a CUDA GPU, where the
# step replays a CUDA graph (CI has none; a lent GPU runs them: benchmarks/gpu_checks.sh).
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA GPU"))]

PROMPT_IDS = [5, 17, 9, 30, 2, 11]
LONG = 120  # past the test model's block_size (32) several times: the window slides and re-encodes
# Compiled kernels may sum in another order than eager ones: a log-probability may move this much.
LOGPROB_TOLERANCE = 1e-4


def completions(loaded_run, **settings) -> list[list[int]]:
    result = generate_completions(loaded_run, PROMPT_IDS, GenerationSettings(**settings))
    return [completion.token_ids for completion in result.completions]


@pytest.fixture(params=DEVICES)
def device_run(request, loaded_run, run_dir):
    """The session's run on each device of ``DEVICES``."""
    return loaded_run if request.param == "cpu" else load_run(run_dir, torch.device(request.param))


@pytest.mark.parametrize("sampling", [dict(temperature=0), dict(temperature=0.9, top_k=40, seed=3)])
def test_compiled_tokens_equal_eager_and_the_recomputation_across_the_window(device_run, sampling):
    compiled = completions(device_run, max_new_tokens=LONG, compile=True, **sampling)
    eager = completions(device_run, max_new_tokens=LONG, **sampling)
    recomputed = completions(device_run, max_new_tokens=LONG, use_cache=False, **sampling)
    assert len(set(compiled[0])) > 20  # a model stuck on one token would prove nothing
    assert compiled == eager == recomputed


def test_a_long_generation_compiles_once(device_run):
    engine = Engine(device_run.model, max_batch=1, batch_invariant=False, compile=True)
    graphs = counters["stats"]["unique_graphs"]
    [finish] = serve(engine, [(PROMPT_IDS, SamplingSettings(max_new_tokens=3 * LONG, temperature=0))])
    assert finish.completion_tokens == 3 * LONG
    assert counters["stats"]["unique_graphs"] == graphs  # every length, slide included, reused the graph
    assert engine.compiled.compile_seconds > 0


@pytest.mark.e2e  # a compile of its own (three rows, batch-invariant)
def test_a_step_compiled_on_one_thread_serves_on_the_engine_thread(device_run):
    """The server's handoff: compiled on the main thread, stepped on the engine's (CUDA graph trees keep
    per-thread state), it replies as on the thread that compiled it."""
    requests = [(PROMPT_IDS, SamplingSettings(max_new_tokens=40, temperature=0.8, seed=11)),
                ([7, 8, 9], SamplingSettings(max_new_tokens=25, temperature=0.0))]
    here = serve(Engine(device_run.model, max_batch=3, compile=True), requests, logprobs=3)
    engine = Engine(device_run.model, max_batch=3, compile=True)
    finished: dict[int, Finish] = {}
    done = threading.Event()

    def collect(i: int):
        def on(event: Event) -> None:
            if event.finish is not None:
                finished[i] = event.finish
                if len(finished) == len(requests):
                    done.set()
        return on

    with engine:  # the engine's thread
        for i, (ids, settings) in enumerate(requests):
            engine.submit(ids, settings, collect(i), logprobs=3)
        assert done.wait(timeout=120), "the engine thread did not finish"
    assert [finished[i] for i in range(len(requests))] == here


def test_compiled_logprobs_stay_within_the_bound_of_eager(loaded_run):
    request = [(PROMPT_IDS, SamplingSettings(max_new_tokens=LONG, temperature=0))]
    compiled, eager = (serve(Engine(loaded_run.model, max_batch=1, batch_invariant=False, compile=compile), request,
                             logprobs=3)[0] for compile in (True, False))
    assert compiled.token_ids == eager.token_ids
    pairs = [(c, e) for c, e in zip(compiled.logprobs, eager.logprobs)]
    worst = max(abs(c.logprob - e.logprob) for c, e in pairs)
    print(f"compiled vs eager log-probabilities: largest difference {worst:.2e}")
    assert worst <= LOGPROB_TOLERANCE, f"compiled log-probabilities differ from eager by up to {worst:.2e}"
    assert all([t for t, _ in c.top] == [t for t, _ in e.top] for c, e in pairs)


@pytest.mark.e2e  # a second compile (three rows, batch-invariant): seconds more
def test_a_compiled_server_row_equals_the_request_alone_bit_for_bit(device_run):
    engine = Engine(device_run.model, max_batch=3, compile=True)  # batch-invariant, as the server builds it
    mine = (PROMPT_IDS, SamplingSettings(max_new_tokens=50, temperature=0.8, seed=11))
    others = [([7, 8, 9], SamplingSettings(max_new_tokens=20, temperature=1.0, seed=1)),
              ([3] * 20, SamplingSettings(max_new_tokens=70, temperature=0.0))]
    [alone] = serve(engine, [mine], logprobs=3)
    together = serve(engine, [others[0], mine, others[1]], logprobs=3)[1]
    assert together.token_ids == alone.token_ids
    assert together.logprobs == alone.logprobs  # the same bits (a CUDA graph's outputs are copied out)


def test_generate_py_compile_reports_its_compile_once_and_prints_the_eager_text(capsys, run_dir):
    argv = ["--run", str(run_dir), "--prompt", "ROMEO:", "--temperature", "0", "--max-new-tokens", "40"]
    assert main(argv) == 0
    eager_out, eager_err = capsys.readouterr()
    assert main([*argv, "--compile"]) == 0
    out, err = capsys.readouterr()
    assert out == eager_out
    assert err.count(" the decode step ") == 1 and "decode step" not in eager_err
    # A build's own compiler processes kept this command off the cores, not other programs.
    assert "built the decode step" not in err or "other programs" not in err


def test_a_compiled_chat_replies_as_the_eager_one_and_says_it_compiled(loaded_run):
    def conversation(compile: bool) -> tuple[list[list[int]], list[str]]:
        notices: list[str] = []
        session = ChatSession(loaded_run, GenerationSettings(temperature=0, max_new_tokens=9, compile=compile),
                              system_prompt="You are JULIET.", on_notice=notices.append)
        return [session.reply(text).token_ids for text in ("Who is there?", "O Romeo", "the fox")], notices

    compiled, notices = conversation(compile=True)
    eager, eager_notices = conversation(compile=False)
    assert compiled == eager
    assert [n for n in notices if " the decode step " in n] == notices[:1]
    assert not any("decode step" in n for n in eager_notices)


# Inductor runs $CXX when it is set, whatever else is installed: the refusal names that one.
@pytest.mark.parametrize("command, cxx", [("generate.py", None), ("serve.py", None), ("generate.py", "no-such-g++")])
def test_compile_without_a_cxx_compiler_is_refused_before_loading(capsys, monkeypatch, tmp_path, command, cxx):
    monkeypatch.setattr("inference.compiled_step.shutil.which", lambda name: None)
    if cxx:
        monkeypatch.setenv("CXX", str(tmp_path / cxx))
    else:
        monkeypatch.delenv("CXX", raising=False)
    missing = tmp_path / "not-a-run"  # the refusal comes before the run is looked for
    if command == "generate.py":
        code = main(["--run", str(missing), "--device", "cpu", "--compile", "--prompt", "x"])
    else:
        from serving.cli import main as serve_main  # here: a GPU machine running the rest may lack the server's packages

        code = serve_main(["--run", str(missing), "--port", "0", "--device", "cpu", "--compile"])
    line = one_error_line(code, *capsys.readouterr(), "error: torch.compile needs a C++ compiler on the CPU")
    ending = f"CPU: {str(tmp_path / cxx)!r} ($CXX) was not found; drop --compile" if cxx else "; drop --compile"
    assert line.endswith(ending)


# Latent attention, with rotary positions (the rotary key beside a latent of 24) too, and grouped-query
# attention with rotary and with no positions: the compiled step hands every kind its positions at its
# slots, and the rotary and position-free ones roll their cache past the window (LONG tokens).
KINDS = {"mla": dict(n_kv_head=4, attention="mla", kv_latent_dim=32),
         "mla-rope": dict(n_kv_head=4, attention="mla", kv_latent_dim=24, positions="rope"),
         "gqa-rope": dict(n_kv_head=2, positions="rope"),
         "gqa-none": dict(n_kv_head=2, positions="none")}


@pytest.mark.e2e  # a compile of its own
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("device", DEVICES)
def test_a_compiled_model_of_each_kind_decodes_as_eager(device, kind):
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64, **KINDS[kind])
    model = GPT(config).eval().to(device)
    settings = SamplingSettings(max_new_tokens=LONG, temperature=0.9, seed=1)
    [eager] = decode(model, [PROMPT_IDS], settings)
    [compiled] = decode(model, [PROMPT_IDS], settings, compile=True)
    assert compiled.token_ids == eager.token_ids and len(set(eager.token_ids)) > 20


@pytest.mark.e2e  # a compile of its own
@pytest.mark.parametrize("kind", ["mla-rope", "gqa-none"])
def test_batch_invariant_rows_of_each_kind_decode_as_eager_bit_for_bit(kind):
    """The server's arithmetic (products in row blocks, whole cache rows), compiled, on two rows of
    unequal prompts that both roll past the window: each row's tokens equal eager's."""
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64, **KINDS[kind])
    model = GPT(config).eval()
    requests = [(PROMPT_IDS, SamplingSettings(max_new_tokens=LONG, temperature=0.9, seed=1)),
                ([7, 8, 9], SamplingSettings(max_new_tokens=LONG - 30, temperature=0.0))]
    eager = serve(Engine(model, max_batch=2), requests)
    compiled = serve(Engine(model, max_batch=2, compile=True), requests)
    assert [f.token_ids for f in compiled] == [f.token_ids for f in eager]
    assert len(set(eager[0].token_ids)) > 20


@pytest.mark.parametrize("batch_invariant", [False, pytest.param(True, marks=pytest.mark.e2e)])  # True: a compile of its own
def test_a_compiled_row_reads_only_its_window_unless_batch_invariant(loaded_run, batch_invariant):
    """Off the server a CPU step reads only the slots up to the longest row's; the batch-invariant step
    reads every slot under its mask. NaN past the row tells which: a masked NaN still poisons attention."""
    engine = Engine(loaded_run.model, max_batch=1, batch_invariant=batch_invariant, compile=True)
    assert engine.compiled.compile_seconds > 0
    engine.cache.lengths[0] = len(PROMPT_IDS)
    with torch.inference_mode():
        clean = engine.compiled({0: 7}).clone()
        for buffer in engine.cache.buffers.values():
            buffer[:, :, :, len(PROMPT_IDS) + 1:engine.cache.max_len - 1] = float("nan")
        engine.cache.lengths[0] = len(PROMPT_IDS)
        poisoned = engine.compiled({0: 7})
    if batch_invariant:
        assert poisoned.isnan().all()
    else:
        assert torch.equal(poisoned, clean)


@pytest.mark.e2e  # a compile per model
def test_two_compiled_models_in_one_process_each_decode_as_their_eager_selves():
    """Two models of one shape share the step's code: stepped in turn, each must still run with its
    own weights."""
    config = GPTConfig(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    models = [GPT(config).eval() for _ in range(2)]
    for seed, model in enumerate(models):
        torch.manual_seed(seed)
        for parameter in model.parameters():
            torch.nn.init.normal_(parameter, std=0.2)
    engines = [Engine(model, max_batch=1, batch_invariant=False, compile=True) for model in models]
    with torch.inference_mode():
        for engine in engines:
            engine.model(torch.tensor([PROMPT_IDS]), cache=engine.cache, rows=[0])
        ids = list(PROMPT_IDS)
        for token in (3, 4, 5):
            ids.append(token)
            for model, engine in zip(models, engines):
                compiled = engine.compiled({0: token})[0]
                eager = model(torch.tensor([ids]))[0, -1]
                assert (compiled - eager).abs().max().item() <= LOGPROB_TOLERANCE
