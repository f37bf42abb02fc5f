"""The exported folder's README.md: what the graph takes and returns, and a decoding loop that
needs only numpy, onnxruntime and tokenizers (tests run it exactly as written here)."""

from __future__ import annotations

from model.gpt import GPTConfig

DYNAMIC_LOOP = '''import json, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer

folder, prompt = "FOLDER", "ROMEO:"
config = json.load(open(f"{folder}/config.json"))
tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
session = ort.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
heads, head_dim = config["num_key_value_heads"], config["onnx"]["head_dim"]
past = {f"past_key_values.{i}.{kind}": np.zeros((1, heads, 0, head_dim), np.float32)
        for i in range(config["num_hidden_layers"]) for kind in ("key", "value")}
ids = tokenizer.encode(prompt).ids
new = list(ids)  # the first call reads the whole prompt on an empty past
for _ in range(min(100, config["max_position_embeddings"] - len(ids) + 1)):
    start = len(ids) - len(new)  # tokens already in the past
    logits, *presents = session.run(None, {
        "input_ids": np.array([new]), "attention_mask": np.ones((1, len(ids)), np.int64),
        "position_ids": np.arange(start, len(ids))[None], **past})
    past = dict(zip(past, presents))  # present.{i}.* come in the order of past_key_values.{i}.*
    new = [int(logits[0, -1].argmax())]  # greedy
    ids += new
print(tokenizer.decode(ids))
'''

STATIC_LOOP = '''import json, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer

folder, prompt = "FOLDER", "ROMEO:"
config = json.load(open(f"{folder}/config.json"))
tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
session = ort.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
slots = config["max_position_embeddings"]
shape = (config["onnx"]["batch_size"], config["num_key_value_heads"], slots, config["onnx"]["head_dim"])
cache = {f"past_key_values.{i}.{kind}": np.zeros(shape, np.float32)
         for i in range(config["num_hidden_layers"]) for kind in ("key", "value")}
mask = np.zeros((shape[0], slots), np.int64)
ids = tokenizer.encode(prompt).ids
for position in range(min(len(ids) + 99, slots)):  # the prompt one token a call, then 100 new
    mask[:, position] = 1  # the slot this call writes
    logits, *cache_out = session.run(None, {
        "input_ids": np.full((shape[0], 1), ids[position]), "attention_mask": mask,
        "position_ids": np.full((shape[0], 1), position), **cache})
    cache = dict(zip(cache, cache_out))
    if position == len(ids) - 1:  # past the prompt: keep the greedy token
        ids.append(int(logits[0, -1].argmax()))
print(tokenizer.decode(ids))
'''


def decoding_loop(folder: str, static: bool) -> str:
    """The README's Python block for the form exported to ``folder``."""
    return (STATIC_LOOP if static else DYNAMIC_LOOP).replace("FOLDER", folder)


def export_readme(name: str, config: GPTConfig, static_batch: int | None) -> str:
    """README.md for the export called ``name`` of a model of ``config``."""
    static = static_batch is not None
    layers = config.n_layer
    cache_shape = (f"({static_batch}, {config.n_kv_head}, {config.block_size}, {config.head_dim})" if static
                   else f"(batch, {config.n_kv_head}, past_sequence_length, {config.head_dim})")
    present_shape = cache_shape if static else cache_shape.replace("past_sequence_length", "past_sequence_length + sequence_length")
    if static:
        form = f"""The **static** form: every shape is fixed. Batch {static_batch}; a preallocated cache of
{config.block_size} slots (`max_position_embeddings`) per layer; one new token per row and call.

| input | shape | meaning |
|---|---|---|
| `input_ids` | ({static_batch}, 1) int64 | the token of this call |
| `position_ids` | ({static_batch}, 1) int64 | its position: the cache slot it is written to |
| `attention_mask` | ({static_batch}, {config.block_size}) int64 | 1 for every slot written so far, this call's included |
| `past_key_values.{{i}}.key` / `.value` | {cache_shape} float32 | layer i's cache |

Outputs: `logits` ({static_batch}, 1, {config.vocab_size}), and `present.{{i}}.key` / `.value`, the cache
with this call's slot written: feed them back as the next call's `past_key_values`. Slots the mask
leaves at 0 are never read, so the cache needs no zeroing to start a new sequence.

Fixed shapes are what ahead-of-time compilers and NPU back ends need: ONNX Runtime's QNN (Qualcomm
Hexagon NPU) and NNAPI (Android) execution providers, Core ML on Apple devices, Intel's NPU through
OpenVINO, and TensorRT engines built without shape ranges. Desktop and server CPUs and GPUs run the
dynamic form (`export.py` without `--static-shapes`), which reads a whole prompt in one call."""
    else:
        form = f"""The **dynamic** form, named as Hugging Face Optimum names decoders: batch, the number of new
tokens and the past length are all dynamic, and an empty past (length 0) starts a sequence.

| input | shape | meaning |
|---|---|---|
| `input_ids` | (batch, sequence_length) int64 | the new tokens |
| `attention_mask` | (batch, past_sequence_length + sequence_length) int64 | 1 for real tokens, 0 for padding |
| `position_ids` | (batch, sequence_length) int64 | the new tokens' positions, from 0 at each row's first real token |
| `past_key_values.{{i}}.key` / `.value` | {cache_shape} float32 | layer i's keys and values so far |

Outputs: `logits` (batch, sequence_length, {config.vocab_size}), and `present.{{i}}.key` / `.value`
{present_shape}: the past with the new tokens appended; feed them back as the next call's past.

Rows of different lengths share a batch with left padding: pad each row at the start, mark the
padding 0 in `attention_mask`, and number each row's real tokens from 0 in `position_ids`.
Runtimes that need fixed shapes (NPUs, ahead-of-time compilers) take the `--static-shapes` export."""
    return f"""# {name}: ONNX decoder

A {layers}-layer GPT ({config.n_head} query heads sharing {config.n_kv_head} key/value heads) trained
with minigpt, exported to one ONNX graph with a key/value cache. It runs on ONNX Runtime (or any ONNX
runtime) with no PyTorch and no code from the training repository.

{form}

The model has learned absolute positions: a sequence holds at most {config.block_size} tokens
(`max_position_embeddings`). Going further means re-encoding the most recent tokens from position 0,
which the loop below does not do.

## Decoding with onnxruntime

`pip install onnxruntime tokenizers numpy`, then (greedy, 100 tokens):

```python
{decoding_loop(name, static).rstrip()}
```
"""
