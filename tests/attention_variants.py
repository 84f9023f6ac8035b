"""What the attention tests run over: both code paths, query/key-value head counts and
the blocks (as model overrides).

Four query heads cover MHA, GQA and MQA, but GQA there is 2 groups of 2, where the
group and head axes of a (B, n_head, ...) tensor are interchangeable: a reshape with
them swapped gives the same tensor. The realistic counts (8, 2), (8, 4), (12, 4) and
(12, 3) (the gpt2 preset with model.n_kv_head=4 is (12, 4)) tell them apart. Every
layout keeps head_dim 8, so the models stay tiny (n_embd = 8 x n_head).
"""

import pytest
import yaml

from conf import CONF_DIR

IMPLS = ["sdpa", "manual"]  # torch's fused kernel, and the explicit one
FOUR_HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA
REALISTIC_GQA = [(8, 2), (8, 4), (12, 4), (12, 3)]
LAYOUTS = [pytest.param(h, kv, id=f"{h}q{kv}kv") for h, kv in FOUR_HEADS + REALISTIC_GQA]  # (n_head, n_kv_head)
SHARED_KV = [p for p in LAYOUTS if p.values[1] < p.values[0]]  # GQA and MQA


def heads(n_head: int, n_kv_head: int) -> dict[str, int]:
    """Model overrides for the layout."""
    return dict(n_head=n_head, n_kv_head=n_kv_head, n_embd=8 * n_head)


LLAMA = yaml.safe_load((CONF_DIR / "model" / "block" / "llama.yaml").read_text())  # what model/block=llama sets
NANOCHAT = yaml.safe_load((CONF_DIR / "model" / "block" / "nanochat.yaml").read_text())
BLOCKS = [pytest.param({}, id="gpt2"), pytest.param(LLAMA, id="llama"), pytest.param(NANOCHAT, id="nanochat")]
