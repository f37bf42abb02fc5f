"""From the model to a checked ``model.onnx``: example inputs, dynamic axes, the exporter, the checker.

The exporter is ``torch.onnx.export(..., dynamo=True)``, which sees every shape as a symbol, so
batch, new tokens and past length become named dynamic axes; the legacy TorchScript tracer has no
conversion for ``aten::rms_norm`` at any opset."""

import logging
import warnings
from pathlib import Path

import torch
from torch.export import Dim

from model.gpt import GPT
from exporting.onnx.decoder import DynamicDecoder, StaticDecoder, cache_entries, input_names, output_names


def export_graph(model: GPT, path: Path, *, static_batch: int | None = None) -> None:
    """Write ``model`` as an ONNX decoder to ``path`` and check it: the dynamic form, or with
    ``static_batch`` the fixed-shape form for that many rows."""
    if static_batch is None:
        wrapper = DynamicDecoder(model)
        inputs, dynamic_shapes = _dynamic_example(model)
    else:
        wrapper = StaticDecoder(model)
        inputs, dynamic_shapes = _static_example(model, static_batch), None
    with torch.no_grad(), warnings.catch_warnings(), _quiet_exporter():
        warnings.simplefilter("ignore")  # the exporter's deprecation notes are for PyTorch developers
        program = torch.onnx.export(
            wrapper.eval(), inputs, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False,
            input_names=input_names(model), output_names=output_names(model),
        )
    if static_batch is None:
        _name_total_length(program.model)
    program.save(str(path))
    import onnx

    onnx.checker.check_model(str(path), full_check=True)


def _name_total_length(graph_model) -> None:
    """Give the mask's axis the name the presents' length has, past_sequence_length +
    sequence_length, instead of the exporter's internal symbol."""
    import onnx_ir as ir

    mask = graph_model.graph.inputs[1]
    present = graph_model.graph.outputs[1]
    mask.shape = ir.Shape([mask.shape[0], present.shape[2]])


# The dynamic form is traced on 2 new tokens after a past of 3 (see _dynamic_example): the
# shortest window those fit in.
MIN_DYNAMIC_BLOCK_SIZE = 5


def _dynamic_example(model: GPT) -> tuple[tuple[torch.Tensor, ...], dict]:
    """Inputs of sizes that no axis shares, so the exporter keeps every axis a symbol of its own
    (sizes 0 and 1 would be fixed into the graph); and the axes that stay dynamic."""
    config = model.config
    batch, new, past = 4, 2, 3
    ids = torch.zeros(batch, new, dtype=torch.long)
    mask = torch.ones(batch, past + new, dtype=torch.long)
    positions = torch.arange(past, past + new).expand(batch, new)
    pasts = _caches(model, batch, past)
    rows = Dim("batch", min=1)
    tokens = Dim("sequence_length", min=1, max=config.block_size)
    history = Dim("past_sequence_length", min=0, max=config.block_size - 1)
    # The mask spans past + new: torch.export derives that sum from the graph itself.
    shapes = {
        "input_ids": {0: rows, 1: tokens},
        "attention_mask": {0: rows, 1: Dim.DYNAMIC},
        "position_ids": {0: rows, 1: tokens},
        "pasts": tuple({0: rows, 2: history} for _ in pasts),
    }
    return (ids, mask, positions, *pasts), shapes


def _static_example(model: GPT, batch: int) -> tuple[torch.Tensor, ...]:
    config = model.config
    slots = config.block_size
    ids = torch.zeros(batch, 1, dtype=torch.long)
    mask = torch.zeros(batch, slots, dtype=torch.long)
    positions = torch.zeros(batch, 1, dtype=torch.long)
    return (ids, mask, positions, *_caches(model, batch, slots))


def _caches(model: GPT, batch: int, length: int) -> tuple[torch.Tensor, ...]:
    entries = cache_entries(model).values()
    return tuple(torch.zeros(batch, heads, length, dim) for _ in range(model.config.n_layer) for heads, dim in entries)


class _quiet_exporter:
    """Silence the exporter's progress lines and notes for one export: ``export.py`` prints its own."""

    def __enter__(self) -> None:
        self._levels = {name: logging.getLogger(name).level for name in ("torch.onnx", "torch.export", "onnxscript")}
        for name in self._levels:
            logging.getLogger(name).setLevel(logging.ERROR)

    def __exit__(self, *exc: object) -> None:
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
