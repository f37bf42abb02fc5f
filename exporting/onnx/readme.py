"""The exported folder's README.md: what the graph takes and returns, and a decoding loop that
needs only numpy, onnxruntime and tokenizers (tests run it exactly as written here)."""

from model.config import GPTConfig
from model.gpt import GPT
from exporting.onnx.decoder import cache_entries

DYNAMIC_LOOP = '''import json, numpy as np, onnxruntime as ort
from tokenizers import Tokenizer

folder, prompt = FOLDER, "ROMEO:"
config = json.load(open(f"{folder}/config.json"))
tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
session = ort.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
past = {f"past_key_values.{i}.{name}": np.zeros((1, heads, 0, dim), np.float32)  # an empty past
        for i in range(config["num_hidden_layers"]) for name, (heads, dim) in config["onnx"]["cache"].items()}
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

folder, prompt = FOLDER, "ROMEO:"
config = json.load(open(f"{folder}/config.json"))
tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
session = ort.InferenceSession(f"{folder}/model.onnx", providers=["CPUExecutionProvider"])
batch, slots = config["onnx"]["batch_size"], config["max_position_embeddings"]
cache = {f"past_key_values.{i}.{name}": np.zeros((batch, heads, slots, dim), np.float32)
         for i in range(config["num_hidden_layers"]) for name, (heads, dim) in config["onnx"]["cache"].items()}
mask = np.zeros((batch, slots), np.int64)
ids = tokenizer.encode(prompt).ids
for position in range(min(len(ids) + 99, slots)):  # the prompt one token a call, then 100 new
    mask[:, position] = 1  # the slot this call writes
    logits, *cache_out = session.run(None, {
        "input_ids": np.full((batch, 1), ids[position]), "attention_mask": mask,
        "position_ids": np.full((batch, 1), position), **cache})
    cache = dict(zip(cache, cache_out))
    if position == len(ids) - 1:  # past the prompt: keep the greedy token
        ids.append(int(logits[0, -1].argmax()))
print(tokenizer.decode(ids))
'''


def decoding_loop(folder: str, static: bool) -> str:
    """The README's Python block for the form exported to ``folder``: its absolute path, so the
    loop runs from any working directory, written as a Python literal (``repr``), so that quotes
    or backslashes in it cannot break the code."""
    return (STATIC_LOOP if static else DYNAMIC_LOOP).replace("FOLDER", repr(folder))


def export_readme(name: str, folder: str, model: GPT, static_batch: int | None) -> str:
    """README.md for the export called ``name`` of ``model``, written to ``folder`` (an absolute path)."""
    config, static = model.config, static_batch is not None
    entries = cache_entries(model)
    presents = " / ".join(f"`present.{{i}}.{entry}`" for entry in entries)
    rows = "\n".join(
        f"| `past_key_values.{{i}}.{entry}` | ({static_batch if static else 'batch'}, {heads}, "
        f"{config.block_size if static else 'past_sequence_length'}, {dim}) float32 | layer i's {_MEANING.get(entry, entry)} |"
        for entry, (heads, dim) in entries.items()
    )
    if static:
        form = f"""The **static** form: every shape is fixed. Batch {static_batch}; a preallocated cache of
{config.block_size} slots (`max_position_embeddings`) per layer; one new token per row and call.

| input | shape | meaning |
|---|---|---|
| `input_ids` | ({static_batch}, 1) int64 | the token of this call |
| `position_ids` | ({static_batch}, 1) int64 | its position: the cache slot it is written to |
| `attention_mask` | ({static_batch}, {config.block_size}) int64 | 1 for every slot written so far, this call's included |
{rows}

Outputs: `logits` ({static_batch}, 1, {config.vocab_size}), and {presents}: the cache with this
call's slot written; feed them back as the next call's `past_key_values`. Slots the mask leaves at
0 are never read, so the cache needs no zeroing to start a new sequence.

{STATIC_RUNTIMES}"""
    else:
        form = f"""The **dynamic** form, named as Hugging Face Optimum names decoders: batch, the number of new
tokens and the past length are all dynamic, and an empty past (length 0) starts a sequence.

| input | shape | meaning |
|---|---|---|
| `input_ids` | (batch, sequence_length) int64 | the new tokens |
| `attention_mask` | (batch, past_sequence_length + sequence_length) int64 | 1 for real tokens, 0 for padding |
| `position_ids` | (batch, sequence_length) int64 | the new tokens' positions, from 0 at each row's first real token |
{rows}

Outputs: `logits` (batch, sequence_length, {config.vocab_size}), and {presents}, the past
with the new tokens appended (past_sequence_length + sequence_length); feed them back as the next
call's past.

Rows of different lengths share a batch with left padding: pad each row at the start, mark the
padding 0 in `attention_mask`, and number each row's real tokens from 0 in `position_ids`.
Runtimes that need fixed shapes (NPUs, ahead-of-time compilers) take the `--static-shapes` export."""
    return f"""# {name}: ONNX decoder

A {config.n_layer}-layer GPT trained with minigpt, exported to one ONNX graph with its cache; its attention:
{_attention(config)}.
It runs on ONNX Runtime (or any ONNX runtime) with no PyTorch and no code from the training
repository. `config.json` holds its sizes; its `onnx` entry gives the form
(`shapes`, `batch_size`) and each cached tensor's (heads, dim) per token and layer (`cache`).

{form}

The model has learned absolute positions: a sequence holds at most {config.block_size} tokens
(`max_position_embeddings`). Going further means re-encoding the most recent tokens from position 0
on an empty past, which the loop below does not do.

## Decoding with onnxruntime

`pip install onnxruntime tokenizers numpy`, then (greedy, 100 tokens; `folder` is where the export was
written: change it if you move the folder):

```python
{decoding_loop(folder, static).rstrip()}
```
"""


_MEANING = {"key": "keys so far", "value": "values so far",
            "latent": "key/value latents so far (one per token, shared by every head)"}

STATIC_RUNTIMES = """Fixed shapes are what ahead-of-time compilers and NPU back ends need: ONNX Runtime's QNN (Qualcomm
Hexagon NPU) and NNAPI (Android) execution providers, Core ML on Apple devices, Intel's NPU through
OpenVINO, and TensorRT engines built without shape ranges. Desktop and server CPUs and GPUs run the
dynamic form (`export.py` without `--static-shapes`), which reads a whole prompt in one call."""


def _attention(config: GPTConfig) -> str:
    if config.attention == "mla":
        return (f"multi-head latent attention, {config.n_head} heads whose keys and values are up-projected\n"
                f"from one cached latent of {config.kv_latent_dim} numbers per token and layer")
    return f"{config.n_head} query heads sharing {config.n_kv_head} key/value heads"
