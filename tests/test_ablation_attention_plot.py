"""The attention heatmap figure: one panel per (layout, query head), token tick labels,
one colour bar, causal mask in grey, and kv groups visible in titles and frames."""

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure, FigureBase

from ablation import attention_plot
from ablation.attention_plot import AttentionLayout, _figure, kv_head_of, plot_attention, sharing, token_labels

N_HEAD, T = 4, 12
TOKENS = ["def", " __", "init", "__(", "self", ",", " name", "):", "\n", "\t", "", "$x$"]
LABELS = ["MHA (4 kv heads)", "GQA (2 kv heads)", "MQA (1 kv heads)"]


def causal_weights(n_head: int, t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(n_head, t, t, generator=g)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def layouts(n_head: int = N_HEAD, t: int = T) -> list[AttentionLayout]:
    return [AttentionLayout(label, kv, causal_weights(n_head, t, kv)) for label, kv in zip(LABELS, (4, 2, 1))]


def panels(fig: Figure) -> list[list]:
    """The heatmap axes, row by row (one subfigure per layout), in column order."""
    rows: dict = {}
    for ax in fig.axes:  # every axes of every subfigure, in the order they were made
        if ax.images:
            rows.setdefault(ax.get_figure(root=False), []).append(ax)
    return [sorted(row, key=lambda ax: ax.get_position().x0) for row in rows.values()]


@pytest.fixture(scope="module")
def built():
    """The figure _figure builds (not built: every artist tested is set when it is
    built) and the figures a colour bar was made on."""
    made = []
    original = FigureBase.colorbar

    def spy(self, *args, **kwargs):
        made.append(self)
        return original(self, *args, **kwargs)

    FigureBase.colorbar = spy
    try:
        fig = _figure(layouts(), TOKENS, "attention")
    finally:
        FigureBase.colorbar = original
    return fig, made


def test_png_is_written_at_110_dpi(tmp_path, monkeypatch):
    calls = []
    original = Figure.savefig

    def spy(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    path = tmp_path / "attention.png"
    plot_attention(layouts(), token_labels(TOKENS), path, "Last-layer attention for 'def __init__' $")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert calls and calls[0]["dpi"] == 110
    assert not plt.get_fignums()  # nothing left open in pyplot


def test_one_heatmap_per_layout_and_query_head(built):
    rows = panels(built[0])
    assert [len(r) for r in rows] == [N_HEAD] * len(LABELS)
    assert sum(len(r) for r in rows) == len(LABELS) * N_HEAD


def test_token_tick_labels_and_outer_axis_titles(built):
    rows = panels(built[0])
    corner = rows[-1][0]
    assert [t.get_text() for t in corner.get_xticklabels()] == token_labels(TOKENS)
    assert [t.get_text() for t in corner.get_yticklabels()] == token_labels(TOKENS)
    assert all(t.get_rotation() == 90 for t in corner.get_xticklabels())
    for r, row in enumerate(rows):
        for h, ax in enumerate(row):
            assert ax.get_xlabel() == ("key" if r == len(rows) - 1 else "")
            assert ax.get_ylabel() == ("query" if h == 0 else "")


def test_exactly_one_shared_colour_bar_from_zero_to_one(built):
    fig, made = built
    assert len(made) == 1
    bars = [ax._colorbar for ax in fig.axes if getattr(ax, "_colorbar", None) is not None]
    assert len(bars) == 1
    assert bars[0].ax.get_ylabel() == "attention weight"
    images = [ax.images[0] for row in panels(fig) for ax in row]
    assert all(im.norm is bars[0].norm for im in images)  # one scale for every panel
    assert all(im.get_clim() == (0.0, 1.0) for im in images)


def test_future_cells_are_masked_grey(built):
    image = panels(built[0])[0][0].images[0]
    data = image.get_array()
    assert np.array_equal(np.ma.getmaskarray(data), np.triu(np.ones((T, T), dtype=bool), k=1))
    assert image.get_cmap().get_bad()[:3] == pytest.approx(to_rgba(attention_plot.MASKED)[:3])


def test_titles_name_the_kv_head_of_each_query_head(built):
    rows = panels(built[0])
    assert rows[1][3].get_title() == "q head 3 → kv head 1"  # GQA, 2 kv heads
    assert [ax.get_title() for ax in rows[1]] == [f"q head {h} → kv head {h // 2}" for h in range(N_HEAD)]
    assert [ax.get_title() for ax in rows[0]] == [f"q head {h} → kv head {h}" for h in range(N_HEAD)]
    assert [ax.get_title() for ax in rows[2]] == [f"q head {h} → kv head 0" for h in range(N_HEAD)]


def test_frames_share_a_colour_exactly_within_a_kv_group(built):
    for row, n_kv in zip(panels(built[0]), (4, 2, 1)):
        frames = [to_rgba(ax.spines["left"].get_edgecolor()) for ax in row]
        for ax, colour in zip(row, frames):  # the whole frame, not one side
            assert all(to_rgba(s.get_edgecolor()) == colour for s in ax.spines.values())
        for a in range(N_HEAD):
            for b in range(N_HEAD):
                same = a // (N_HEAD // n_kv) == b // (N_HEAD // n_kv)
                assert (frames[a] == frames[b]) == same, (n_kv, a, b)


def test_row_labels_say_which_heads_share(built):
    titles = [sub._suptitle.get_text() for sub in built[0].subfigs[0].subfigs]
    assert titles == [
        "MHA (4 kv heads): each head its own kv head",
        "GQA (2 kv heads): heads 0-1 share kv 0, 2-3 share kv 1",
        "MQA (1 kv heads): all heads share one kv head",
    ]
    assert sharing(8, 2) == "heads 0-3 share kv 0, 4-7 share kv 1"
    assert [kv_head_of(h, 12, 4) for h in range(12)] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_long_prompts_label_every_kth_token():
    t = 100
    pieces = [f"t{i}" for i in range(t)]
    fig = _figure([AttentionLayout("MHA (1 kv heads)", 1, causal_weights(1, t, 0))], pieces, "long")
    ax = panels(fig)[0][0]
    assert list(ax.get_xticks()) == list(range(0, t, 3))  # ceil(100 / 48) = 3
    assert [x.get_text() for x in ax.get_xticklabels()] == pieces[::3]


def test_token_labels_make_whitespace_and_control_characters_visible():
    assert token_labels([" the", "a b", "\n", "\n\n", "\t", "", "\x00", "\r", "é", "$"]) == [
        "·the",
        "a·b",
        "⏎",
        "⏎⏎",
        "→",
        "∅",
        "\\x00",
        "\\r",
        "é",
        "$",
    ]
    once = token_labels(TOKENS + ["\x07", "\u200b"])
    assert token_labels(once) == once  # report.py passes labels in already


def test_inconsistent_inputs_are_refused():
    with pytest.raises(ValueError, match="shape"):
        _figure(layouts(), TOKENS[:-1], "x")
    with pytest.raises(ValueError, match="evenly"):
        _figure([AttentionLayout("GQA", 3, causal_weights(N_HEAD, T, 0))], TOKENS, "x")
    with pytest.raises(ValueError, match="no attention"):
        _figure([], TOKENS, "x")
