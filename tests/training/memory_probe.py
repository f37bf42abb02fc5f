"""Run as a script: the peak resident memory of two training steps on the CPU, as JSON on stdout.

The resident set is read before the model is built (torch imported, the batch made) and its
lifetime peak after two steps; the difference is what training added: weights, gradients,
optimizer state and the activations of a step. Arguments: a JSON object of GPTConfig fields,
then one of TrainConfig fields (its batch_size is the micro-batch).
"""

import json
import resource
import sys

import torch

from model.config import GPTConfig
from model.gpt import GPT
from training.config import TrainConfig
from training.optim import build_optimizer, plan_param_groups
from training.recompute import checkpoint_blocks


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_resident_bytes() -> int:
    """This process image's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux carries
    that across exec, so it would start at the peak of the parent that forked us (a large pytest)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(model_fields: str, train_fields: str) -> None:
    torch.set_num_threads(1)
    config, train = GPTConfig(**json.loads(model_fields)), TrainConfig(**json.loads(train_fields))
    tokens = torch.randint(0, config.vocab_size, (train.batch_size, config.block_size + 1))
    before = resident_bytes()
    model = GPT(config)
    if train.activation_checkpointing:
        checkpoint_blocks(model)
    optimizer = build_optimizer(plan_param_groups(model, train), train, torch.device("cpu"))
    for _ in range(2):
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = peak_resident_bytes()
    print(json.dumps({"before": before, "peak": peak, "added": peak - before}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
