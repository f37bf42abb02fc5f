"""serve.py --compile: concurrent requests get the eager server's replies, on the CPU and a CUDA GPU."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from inference.compiled_step import compiler_missing
from server_process import running_server

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.e2e,  # a compile of its own
              pytest.mark.skipif(compiler_missing(torch.device("cpu")) is not None,
                                 reason=str(compiler_missing(torch.device("cpu"))))]

PROMPTS = ["ROMEO: But soft", "JULIET: O", "The quick brown fox"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                  reason="needs a CUDA GPU"))]


def replies(run_dir, *flags: str) -> tuple[list[str], str]:
    with running_server(run_dir, "--max-batch", "3", *flags, timeout_s=300) as server:
        client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="x", max_retries=0, timeout=120)

        def complete(i: int) -> str:
            return client.completions.create(model="tiny-plain", prompt=PROMPTS[i], max_tokens=30, temperature=0.8,
                                             seed=i).choices[0].text

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(complete, range(len(PROMPTS))))
        return texts, server.output()


@pytest.mark.parametrize("device", DEVICES)
def test_a_compiled_server_replies_as_the_eager_one(plain_run_dir, device):
    # On CUDA the server compiles by default: no flag; on the CPU, --compile asks for it.
    compiled, log = replies(plain_run_dir, "--device", device, *(["--compile"] if device == "cpu" else []))
    eager, eager_log = replies(plain_run_dir, "--device", device, "--no-compile")
    assert " the decode step " in log and "compil" not in eager_log and "decode step" not in eager_log
    assert all(text for text in eager)  # an empty reply would prove nothing
    assert compiled == eager
