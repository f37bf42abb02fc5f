"""Figures of attention maps, and of a run's attention over its training (matplotlib's Agg backend).
A map's row i is query position i."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import math

import numpy as np
import torch

from common.files import atomic_output

if TYPE_CHECKING:  # attention.py's readings alone, not a training run's figures
    from analysis.history import AttentionEval
    from analysis.maps import ScaleComparison, SpanRepeat

# Token pieces label the axes only while they stay readable.
MAX_LABELLED_TOKENS = 32
# The grid of every head: its labels' size in points, the room one label takes along an axis
# (inches), and the side of one map (inches), grown to label every token up to the largest.
GRID_FONTSIZE = 8
GRID_LABEL_PITCH = GRID_FONTSIZE * 1.3 / 72
GRID_MAP_INCHES = (2.2, 3.6)
MASKED_COLOUR = "#bdbdbd"
HATCH_COLOUR = "#616161"
# The formats a figure is written in, named by the suffix of its file (a name's suffix must say what
# its bytes are: a .pdf holding a PNG opens nowhere).
FIGURE_FORMATS = ("png", "pdf", "svg")


def _pyplot():
    """matplotlib's pyplot on the Agg backend, imported on first use (it is slow to import)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw_map(ax, probs: torch.Tensor, tokens: Sequence[str] | None, title: str, fontsize: float, *,
              every: int | None = None, x_labels: bool = True, y_labels: bool = True):
    """One map on ``ax``. ``every``: label every that many tokens (None: each token while there are
    at most MAX_LABELLED_TOKENS, none past that); ``x_labels``/``y_labels`` False: that axis bare
    (a grid labels only its outer maps)."""
    weights = probs.detach().float().cpu().numpy()
    T = weights.shape[-1]
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    plt = _pyplot()
    cmap = plt.get_cmap("Blues").with_extremes(bad=MASKED_COLOUR)
    image = ax.imshow(np.ma.masked_array(weights, mask=future), cmap=cmap, vmin=0.0, vmax=1.0,
                      interpolation="nearest")
    # Masked cells grey and hatched: never taken for a zero weight (white), even in a greyscale print.
    ax.add_patch(masked_region(T, hatch="////", fill=False, edgecolor=HATCH_COLOUR, linewidth=0))
    ax.set_title(title, fontsize=fontsize + 1)
    if every is None:
        every = 1 if tokens is not None and len(tokens) <= MAX_LABELLED_TOKENS else 0
    ticks = range(0, T, every) if tokens is not None and every else range(0)
    labels = [tick_labels(tokens)[t] for t in ticks] if tokens is not None else []
    ax.set_xticks(ticks, labels if x_labels else [], rotation=90, fontsize=fontsize)
    ax.set_yticks(ticks, labels if y_labels else [], fontsize=fontsize)
    return image


def grid_map_size(T: int) -> tuple[float, int]:
    """The side of one map of a grid (inches) and the step between its labelled tokens."""
    side = min(max(T * GRID_LABEL_PITCH, GRID_MAP_INCHES[0]), GRID_MAP_INCHES[1])
    return side, math.ceil(T * GRID_LABEL_PITCH / side)


def tick_labels(tokens: Sequence[str]) -> list[str]:
    """Token pieces as axis labels, a line break or tab written as its escape (drawn as itself it
    makes a label several lines tall)."""
    return [token.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t") for token in tokens]


def masked_region(T: int, **style):
    """The cells a causal mask hides in a (T, T) ``imshow`` map, as one staircase polygon on the
    cell boundaries."""
    from matplotlib.patches import Polygon

    corners = [(0.5, -0.5), (T - 0.5, -0.5), (T - 0.5, T - 1.5)]
    for k in range(T - 1, 0, -1):  # up the staircase, one step per row
        corners += [(k - 0.5, k - 0.5), (k - 0.5, k - 1.5)]
    return Polygon(corners[:-1], closed=True, **style)


def draw_attention_grid(
    maps: Sequence[torch.Tensor],
    tokens: Sequence[str] | None,
    out: Path,
    *,
    title: str,
    compare: Sequence[torch.Tensor] | None = None,
    compare_title: str = "untrained",
) -> None:
    """One heatmap per layer (rows) and head (columns) of one sequence, written to ``out``; with
    ``compare`` (maps of the same shape), a second set under ``compare_title``."""
    sets = [(title, maps)] + ([(compare_title, compare)] if compare is not None else [])
    n_layer, n_head = len(maps), maps[0].shape[0]
    plt = _pyplot()
    side, every = grid_map_size(maps[0].shape[-1])
    labels = 1.2 if tokens is not None else 0.0  # inches for the token labels left of and below the maps
    # The sets one above the other: side by side, a figure of two sets of every head is several
    # times wider than high, and a screen shrinks it until its labels cannot be read.
    fig = plt.figure(figsize=(side * n_head + labels + 1.2, (side + 0.3) * n_layer * len(sets) + (labels + 0.5) * len(sets)),
                     layout="constrained")
    # One panel per set, titled once above its heads: titles naming the set in every cell overlap.
    panels = fig.subfigures(len(sets), 1, squeeze=False)[:, 0]
    for panel, (name, layers) in zip(panels, sets):
        axes = panel.subplots(n_layer, n_head, squeeze=False)
        for layer, probs in enumerate(layers):
            for head in range(n_head):
                # Tokens label the outer maps only: the left column's rows, the bottom row's columns.
                image = _draw_map(axes[layer][head], probs[head], tokens, f"layer {layer} head {head}", GRID_FONTSIZE,
                                  every=every, x_labels=layer == n_layer - 1, y_labels=head == 0)
        panel.suptitle(name)
        # A colour bar beside each set keeps every map the same size.
        panel.colorbar(image, ax=axes, shrink=0.6, label="attention weight (hatched grey: masked future)")
    _save(fig, out)


def draw_attention_map(probs: torch.Tensor, tokens: Sequence[str] | None, out: Path, *, title: str) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 7.5), constrained_layout=True)
    image = _draw_map(ax, probs, tokens, title, fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight (hatched grey: masked future)")
    _save(fig, out)


def draw_attention_rows(rows: Sequence[tuple[str, torch.Tensor]], tokens: Sequence[str] | None, out: Path,
                        *, title: str, head_names: Sequence[str]) -> None:
    """One row of heatmaps per ``(label, maps)``, maps being (n, T, T), written to ``out``; map c of
    every row is titled with its label and ``head_names[c]``."""
    cols = max(maps.shape[0] for _, maps in rows)
    size = 2.6 if cols > 1 else 3.6
    plt = _pyplot()
    fontsize = 6 if tokens is not None and len(tokens) > 16 else 8
    fig, axes = plt.subplots(len(rows), cols, figsize=(size * cols + 1.0, size * len(rows) + 0.6),
                             squeeze=False, constrained_layout=True)
    image = None
    for r, (label, maps) in enumerate(rows):
        for c in range(cols):
            if c < maps.shape[0]:
                image = _draw_map(axes[r][c], maps[c], tokens, f"{label}\n{head_names[c]}", fontsize)
            else:
                axes[r][c].axis("off")
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight (hatched grey: masked future)")
    fig.suptitle(title)
    _save(fig, out)


def draw_copy_heads(maps: Sequence[torch.Tensor], names: Sequence[str], tokens: Sequence[str], repeat: SpanRepeat,
                    out: Path, *, title: str) -> None:
    """Heads' (T, T) maps side by side, every token labelled, with the cells the copy score reads
    outlined: a head that copies fills them."""
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    T = maps[0].shape[-1]
    side = max(5.0, T * 0.14)
    fig, axes = plt.subplots(1, len(maps), figsize=(side * len(maps) + 1.2, side + 0.8), squeeze=False,
                             constrained_layout=True)
    image = None
    for ax, probs, name in zip(axes[0], maps, names):
        image = _draw_map(ax, probs, tokens, name, fontsize=6, every=1)
        for j in range(repeat.length):
            query, key = repeat.offset + repeat.period + j - 1, repeat.offset + j
            ax.add_patch(Rectangle((key - 0.5, query - 0.5), 1, 1, fill=False, edgecolor="tab:red", linewidth=1.2))
    fig.colorbar(image, ax=axes[0], shrink=0.6, label="attention weight (red boxes: where copying reads; "
                 "hatched grey: masked future)")
    fig.suptitle(title)
    _save(fig, out)


def draw_scale_comparison(comparison: ScaleComparison, tokens: Sequence[str] | None, out: Path, *,
                          title: str) -> None:
    plt = _pyplot()
    d = comparison.head_dim
    scaled_bits, unscaled_bits = comparison.entropy_bits()
    T = comparison.scaled.shape[-1]
    fontsize = 6 if T > 16 else 8
    fig, axes = plt.subplots(1, 3, figsize=(18, 6), constrained_layout=True)
    image = _draw_map(axes[0], comparison.scaled, tokens,
                      f"softmax(q·k / √{d}), as the model computes it: {scaled_bits:.2f} bits", fontsize)
    _draw_map(axes[1], comparison.unscaled, tokens,
              f"softmax(q·k), the same scores unscaled: {unscaled_bits:.2f} bits", fontsize)
    fig.colorbar(image, ax=axes[:2], shrink=0.8, label="attention weight (hatched grey: masked future)")
    bars, x = axes[2], np.arange(T)
    bars.bar(x - 0.2, comparison.scaled[-1].numpy(), width=0.4, label=f"with 1/√{d}")
    bars.bar(x + 0.2, comparison.unscaled[-1].numpy(), width=0.4, label="without")
    bars.set_ylim(0.0, 1.0)
    bars.set_ylabel("attention weight")
    bars.set_title("the last token's row", fontsize=fontsize + 1)
    if tokens is not None and len(tokens) <= MAX_LABELLED_TOKENS:
        bars.set_xticks(range(T), tick_labels(tokens), rotation=90, fontsize=fontsize)
    bars.legend()
    fig.suptitle(f"{title} (titles: mean entropy over queries)")
    _save(fig, out)


def draw_attention_history(history: Sequence[AttentionEval], out: Path, *, title: str, threshold: float) -> None:
    from analysis.history import first_induction
    plt = _pyplot()
    fig, (entropy, induction) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    steps = [e.step for e in history]
    for layer in range(len(history[0].entropy_bits)):
        entropy.plot(steps, [e.entropy_bits[layer] for e in history], marker="o", label=f"layer {layer}")
    entropy.set_xlabel("step")
    entropy.set_ylabel("mean attention entropy (bits)")
    entropy.legend()
    induction.plot(steps, [e.induction_best for e in history], marker="o", label="best head")
    induction.axhline(threshold, linestyle="--", color="grey", label=f"threshold {threshold}")
    first = first_induction(list(history), threshold)
    if first is not None:
        induction.axvline(first.step, linestyle=":", color="black", label=f"first past it: step {first.step}")
    induction.set_ylim(0.0, 1.0)
    induction.set_xlabel("step")
    induction.set_ylabel("induction score")
    induction.legend()
    fig.suptitle(title)
    _save(fig, out)


def draw_induction_history(history: Sequence[AttentionEval], out: Path, *, title: str, threshold: float) -> None:
    """The two signals of an induction head forming, at every evaluation of a run: the loss on the
    first and second copies of repeated sequences, and the best head's and each layer's induction
    score, each with its threshold and the first evaluation past it."""
    from analysis.history import (COPY_LOSS_RATIO, LAYER_INDUCTION_THRESHOLD, first_copying, first_induction,
                                  first_layer_induction)
    plt = _pyplot()
    fig, (losses, scores) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    logged = [e for e in history if e.repeat_loss_second is not None]
    steps = [e.step for e in logged]
    losses.plot(steps, [e.repeat_loss_first for e in logged], marker="o", label="first copy (unpredictable)")
    losses.plot(steps, [e.repeat_loss_second for e in logged], marker="o", label="second copy (copyable)")
    fell = first_copying(list(history))
    if fell is not None:
        losses.axvline(fell.step, linestyle=":", color="black",
                       label=f"second ≤ {COPY_LOSS_RATIO} × first: step {fell.step}")
    losses.set_ylim(bottom=0.0)
    losses.set_xlabel("step")
    losses.set_ylabel("loss on repeated random tokens (nats)")
    losses.legend()
    steps = [e.step for e in history]
    scores.plot(steps, [e.induction_best for e in history], marker="o", label="best head")
    for layer in range(max(len(e.induction_layers) for e in history)):
        scores.plot(steps, [e.induction_layers[layer] if e.induction_layers else np.nan for e in history],
                    marker=".", label=f"layer {layer}, heads summed")
    scores.axhline(threshold, linestyle="--", color="grey", label=f"head threshold {threshold}")
    scores.axhline(LAYER_INDUCTION_THRESHOLD, linestyle="-.", color="grey",
                   label=f"layer threshold {LAYER_INDUCTION_THRESHOLD}")
    for first, style, what in ((first_induction(list(history), threshold), ":", "head"),
                               (first_layer_induction(list(history)), "--", "layer")):
        if first is not None:
            scores.axvline(first.step, linestyle=style, color="black", label=f"first {what} past it: step {first.step}")
    scores.set_ylim(bottom=0.0)
    scores.set_xlabel("step")
    scores.set_ylabel("induction score (weight on the predicted token)")
    scores.legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, out)


def _save(fig, out: Path) -> None:
    """Write the figure atomically in the format ``out``'s suffix names (PNG without one)."""
    plt = _pyplot()
    suffix = out.suffix.lower().lstrip(".")
    try:
        with atomic_output(out) as tmp:
            # A tight box around everything drawn: constrained layout places square maps (fixed
            # aspect) centred in their cells, and a long first tick label could fall off the edge.
            fig.savefig(tmp, dpi=110, format=suffix if suffix in FIGURE_FORMATS else "png", bbox_inches="tight",
                        pad_inches=0.1)
    finally:
        plt.close(fig)
