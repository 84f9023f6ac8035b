"""The report's attention heatmaps: a row per layout (MHA, GQA, MQA), a panel per query head,
one colour bar, and a coloured frame per key/value group (which query heads share one).

    layouts = [AttentionLayout(label, n_kv_head, attention_maps(model, ids)[-1][0]) ...]
    plot_attention(layouts, token_labels([tokenizer.decode([i]) for i in ids]), path, title)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import numpy as np  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from torch import nn  # noqa: E402

from model import GPT  # noqa: E402
from model.attention import CausalSelfAttention, manual_attention  # noqa: E402

DPI = 110
CMAP = "viridis"  # zero weight is dark, so the light grey of masked cells stands apart
MASKED = "#dcdcdc"  # the strictly-upper (future) triangle
MAX_LABELS = 48  # more tokens than this: label every k-th
MAX_LABEL_CHARS = 12  # longer tick labels are cut, with an ellipsis
FRAME_WIDTH = 2.5

_SHOWN = {" ": "·", "\n": "⏎", "\t": "→"}


@dataclass(frozen=True)
class AttentionLayout:
    label: str  # e.g. "GQA (2 kv heads)"
    n_kv_head: int
    weights: torch.Tensor  # (n_head, T, T) one layer's attention probabilities; rows queries, columns keys


@torch.no_grad()
def attention_maps(model: GPT, idx: torch.Tensor) -> list[torch.Tensor]:
    """Attention weights of every layer of `model` for idx (B, T): a list of (B, n_head, T, T),
    each row a query's distribution over the keys, recomputed by a hook on each attention layer
    on the explicit path (torch's fused kernel never forms them)."""
    maps: list[torch.Tensor] = []

    def record(layer: CausalSelfAttention, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        q, k, v = layer.heads(inputs[0])
        maps.append(manual_attention(q, k, v, nn.Identity())[1])

    hooks = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, CausalSelfAttention)]
    try:
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return maps


def token_labels(pieces: Sequence[str]) -> list[str]:
    """Each token's text as a readable tick label: space '·', newline '⏎', tab '→',
    another unprintable character as its escape (repr without quotes: '\\r', '\\x00'),
    the empty string '∅'. Applying it twice changes nothing."""
    return [
        "".join(_SHOWN.get(ch) or (ch if ch.isprintable() else repr(ch)[1:-1]) for ch in piece) or "∅"
        for piece in pieces
    ]


def kv_head_of(head: int, n_head: int, n_kv_head: int) -> int:
    """The key/value head query head `head` reads (consecutive query heads share one)."""
    return head // (n_head // n_kv_head)


def sharing(n_head: int, n_kv_head: int) -> str:
    """Which query heads share which key/value head, in words."""
    if n_kv_head == n_head:
        return "each head its own kv head"
    if n_kv_head == 1:
        return "all heads share one kv head"
    size = n_head // n_kv_head
    return "heads " + ", ".join(f"{g * size}-{(g + 1) * size - 1} share kv {g}" for g in range(n_kv_head))


def plot_attention(layouts: Sequence[AttentionLayout], tokens: Sequence[str], path: Path, title: str) -> None:
    """Each layout's attention heatmaps (same n_head, T = len(tokens)) as a PNG; tokens go through token_labels."""
    fig = _figure(layouts, tokens, title)
    fig.savefig(path, dpi=DPI, format="png")
    fig.clear()  # a bare Figure, not pyplot's: nothing else holds it once it goes


def _figure(layouts: Sequence[AttentionLayout], tokens: Sequence[str], title: str) -> Figure:
    n_head, T = _check(layouts, tokens)
    labels = token_labels(tokens)
    ticks = list(range(0, T, math.ceil(T / MAX_LABELS)))
    shown = [_cut(labels[i]) for i in ticks]
    panel = min(max(1.2 + 0.085 * len(ticks), 2.0), 5.2)  # inches per heatmap
    fontsize = min(max(0.8 * panel * 72 / len(ticks), 5.0), 8.0)  # points: about 6 at 48 labels
    label_in = max(len(s) for s in shown) * fontsize * 0.62 / 72 + fontsize * 1.6 / 72  # ticks + axis title
    n_rows, grid_w = len(layouts), n_head * (panel + label_in + 0.15)
    width, height = grid_w + 1.1, n_rows * (panel + label_in + 0.75) + 0.45

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    grid, side = fig.subfigures(1, 2, width_ratios=[grid_w, width - grid_w])
    rows = grid.subfigures(n_rows, 1, squeeze=False)[:, 0]
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad=MASKED)
    norm = Normalize(vmin=0.0, vmax=1.0)
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    image = None
    for r, (layout, row) in enumerate(zip(layouts, rows)):
        label = f"{layout.label}: {sharing(n_head, layout.n_kv_head)}"
        row.suptitle(label, x=0.0, ha="left", fontsize=10, fontweight="bold", parse_math=False)
        colours = _group_colours(layout.n_kv_head)
        weights = layout.weights.detach().float().cpu().numpy()
        for h, ax in enumerate(row.subplots(1, n_head, squeeze=False)[0]):
            g = kv_head_of(h, n_head, layout.n_kv_head)
            shown_weights = np.ma.masked_array(weights[h], mask=future)
            image = ax.imshow(shown_weights, cmap=cmap, norm=norm, interpolation="nearest", aspect="equal")
            ax.set_title(
                f"q head {h} → kv head {g}", fontsize=8.5, color=tuple(c * 0.75 for c in colours[g]), parse_math=False
            )
            ax.set_xticks(ticks, shown, rotation=90, fontsize=fontsize, parse_math=False)
            ax.set_yticks(ticks, shown, fontsize=fontsize, parse_math=False)
            ax.tick_params(length=2, pad=1)
            for spine in ax.spines.values():
                spine.set(edgecolor=colours[g], linewidth=FRAME_WIDTH)
            if r == n_rows - 1:
                ax.set_xlabel("key", fontsize=9)
            if h == 0:
                ax.set_ylabel("query", fontsize=9)
    cax = side.add_subplot(side.add_gridspec(3, 1, height_ratios=[1, 4, 1])[1])
    fig.colorbar(image, cax=cax).set_label("attention weight")
    cax.set_box_aspect(18)
    fig.suptitle(title, fontsize=11, parse_math=False)
    return fig


def _check(layouts: Sequence[AttentionLayout], tokens: Sequence[str]) -> tuple[int, int]:
    if not layouts:
        raise ValueError("no attention layouts to plot")
    if not (T := len(tokens)):
        raise ValueError("no tokens to plot")
    n_head = layouts[0].weights.shape[0]
    for layout in layouts:
        shape = tuple(layout.weights.shape)
        if shape != (n_head, T, T):
            raise ValueError(
                f"{layout.label}: attention weights of shape {shape}, expected "
                f"({n_head}, {T}, {T}) (n_head, tokens, tokens)"
            )
        if layout.n_kv_head < 1 or n_head % layout.n_kv_head:
            raise ValueError(f"{layout.label}: {n_head} query heads cannot share {layout.n_kv_head} kv heads evenly")
    return n_head, T


def _group_colours(n_groups: int) -> list[tuple[float, float, float]]:
    """One qualitative colour per kv group: tab10, then tab20's ten lighter shades (they repeat past 20 groups)."""
    colours = list(matplotlib.colormaps["tab10"].colors) + list(matplotlib.colormaps["tab20"].colors[1::2])
    return [tuple(colours[g % len(colours)]) for g in range(n_groups)]


def _cut(label: str) -> str:
    return label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 1] + "…"
