"""The attention figures as drawn: the hatched mask, one-line labels, titles and labels that never overlap."""

import itertools

import numpy as np
import pytest
import torch

import analysis.plot as plot


@pytest.mark.parametrize("T", [1, 2, 5, 17])
def test_the_hatched_region_is_exactly_the_masked_cells(T):
    region = plot.masked_region(T)
    corners = region.get_xy()
    # Every corner sits on a cell boundary (imshow puts cell (i, j) at j +- 0.5, i +- 0.5).
    assert np.all(np.abs(corners - np.round(corners - 0.5) - 0.5) < 1e-12)
    path = region.get_path()
    centres = [(j, i) for i in range(T) for j in range(T)]
    inside = path.contains_points(centres).reshape(T, T)
    np.testing.assert_array_equal(inside, np.triu(np.ones((T, T), dtype=bool), k=1))


def test_the_drawn_map_carries_that_region_and_labels_line_breaks_by_their_escapes():
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    plot._draw_map(ax, torch.full((4, 4), 0.25), ["a", "b", "c", "d"], "t", fontsize=8)
    (patch,) = [p for p in ax.patches if p.get_hatch()]
    np.testing.assert_array_equal(patch.get_xy(), plot.masked_region(4).get_xy())
    # Line breaks and tabs are labelled by their escapes.
    assert plot.tick_labels(["\n", " But", "\t\r\n"]) == ["\\n", " But", "\\t\\r\\n"]


def test_the_panels_of_a_comparison_have_titles_that_do_not_overlap(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plot, "_save", lambda fig, out: drawn.append(fig))
    maps = [torch.softmax(torch.randn(4, 9, 9), dim=-1).tril() for _ in range(2)]
    plot.draw_attention_grid(maps, [f"t{i}" for i in range(9)], tmp_path / "x.png",
                             title="run: attention over the prompt", compare=maps, compare_title="untrained")
    (fig,) = drawn
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    boxes = [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    assert len(boxes) == 2 * 2 * 4
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("T", [21, 70])
def test_the_grid_of_two_sets_is_about_square_with_readable_labels_on_its_outer_maps(tmp_path, monkeypatch, T):
    """--compare-init of a 2-layer model: two sets of 2 x 4 maps. Side by side they made a strip
    four times wider than high, every map carrying its own labels too small to read."""
    drawn = []
    monkeypatch.setattr(plot, "_save", lambda fig, out: drawn.append(fig))
    maps = [torch.softmax(torch.randn(4, T, T), dim=-1).tril() for _ in range(2)]
    tokens = [f" word{i}" for i in range(T)]
    plot.draw_attention_grid(maps, tokens, tmp_path / "x.png", title="run", compare=maps, compare_title="untrained")
    (fig,) = drawn
    width, height = fig.get_size_inches()
    assert 0.5 < width / height < 2
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    maps_drawn = [ax for ax in fig.axes if ax.get_title()]
    assert len(maps_drawn) == 2 * 2 * 4
    shown = {"x": [], "y": []}
    for ax in maps_drawn:
        for axis, labels in (("x", ax.get_xticklabels()), ("y", ax.get_yticklabels())):
            texts = [label for label in labels if label.get_text()]
            if texts:
                shown[axis].append(ax)
                assert all(label.get_fontsize() >= 8 for label in texts)
                boxes = [label.get_window_extent(renderer) for label in texts]
                assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)), (axis, ax.get_title())
                assert texts[0].get_text() == tokens[0] and len(texts) >= min(T, 20)
    # The outer maps only: each set's bottom row carries the columns' labels, its left column the rows'.
    assert sorted(ax.get_title() for ax in shown["x"]) == sorted([f"layer 1 head {h}" for h in range(4)] * 2)
    assert sorted(ax.get_title() for ax in shown["y"]) == sorted([f"layer {l} head 0" for l in range(2)] * 2)


def _margin_is_blank(png_path, margin_px=4) -> bool:
    from matplotlib.image import imread

    image = imread(png_path)[..., :3]
    edges = [image[:margin_px], image[-margin_px:], image[:, :margin_px], image[:, -margin_px:]]
    return all(np.all(edge > 0.99) for edge in edges)


def test_no_label_of_the_scale_figure_falls_off_its_edge(tmp_path):
    # Line breaks first and a long label after them: the case whose first label was cut off.
    from analysis.maps import ScaleComparison

    tokens = ["\n", "\n", "ROMEO-MONTAGUE", ":", "\n", " But", " soft", ",", " what", " light", " through"]
    T = len(tokens)
    weights = torch.softmax(torch.randn(T, T), dim=-1).tril()
    comparison = ScaleComparison(scaled=weights, unscaled=weights, head_dim=32)
    out = tmp_path / "scale.png"
    plot.draw_scale_comparison(comparison, tokens, out, title="run: layer 1 head 0")
    assert _margin_is_blank(out)
