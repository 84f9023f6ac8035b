"""GPT-2's initialisation, drawn so that models of different attention layouts share every weight their shapes allow.

Each block of weights draws from its own generator, seeded from one number taken from torch's global generator and
the block's name. After the same torch.manual_seed, MHA, GQA and MQA models start with identical embeddings, MLPs,
output and query weights, and the key/value heads a model has equal the MHA model's first ones (match_mha_params
draws only its extra MLP units afresh): ablation arms paired by seed differ only where the layout makes them.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn

STD = 0.02  # GPT-2's


def draw_seed() -> int:
    """The one number a model's initialisation takes from torch's global generator, before building any layer
    draws a shape-dependent amount; on the meta device (shapes only) none, so counting never moves a run's streams."""
    if torch.empty(0).is_meta:
        return 0
    return int(torch.randint(0, 2**62, (), device="cpu").item())


def init_weights(model: nn.Module, seed: int) -> None:
    """Normal(0, 0.02) weights for every Linear and Embedding, zero biases, norms as built; the projections into the
    residual stream get 0.02 / sqrt(2 * n_layer), as each block adds two (zero with zero_init_proj)."""
    config = model.config
    residual_std = STD / math.sqrt(2 * config.n_layer)
    seen: set[int] = set()  # a tied head is the token table: initialise it once
    for module_name, module in model.named_modules():
        # (on the meta device, shapes only: nothing to draw)
        if not isinstance(module, (nn.Linear, nn.Embedding)) or module.weight.is_meta or id(module.weight) in seen:
            continue
        seen.add(id(module.weight))
        std = residual_std if module_name.endswith("c_proj") else STD
        for label, index in _blocks(module_name, config):
            target = module.weight.data[index]
            # A CPU generator (one stream anywhere) uses 32 bits of its seed.
            generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{module_name}:{label}".encode()))
            target.copy_(torch.empty(target.shape, device="cpu").normal_(0.0, std, generator=generator))
        if config.zero_init_proj and module_name.endswith(("attn.c_proj", "mlp.c_proj")):
            nn.init.zeros_(module.weight)  # drawn first all the same: no other weight's stream moves
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)


def _blocks(module_name: str, config) -> list[tuple[str, tuple]]:
    """The named pieces of a weight that models of other layouts also have."""
    if module_name.endswith("attn.c_attn"):
        # Rows [q | k | v]: q is n_head heads, k and v n_kv_head heads each; one block per head.
        C, d = config.n_embd, config.head_dim
        blocks = [("q", (slice(0, C),))]
        for part, start in (("k", C), ("v", C + config.kv_heads * d)):
            blocks += [(f"{part}{h}", (slice(start + h * d, start + (h + 1) * d),)) for h in range(config.kv_heads)]
        return blocks
    if module_name.endswith(("mlp.c_fc", "mlp.c_gate", "mlp.c_proj")):
        # The hidden dimension (rows of c_fc and c_gate, columns of c_proj): the MLP's own
        # units (GPT-2's 4 * n_embd), then any extra that match_mha_params adds.
        width, hidden = config.mlp_base_hidden, config.mlp_hidden
        axis = (slice(None),) if module_name.endswith("c_proj") else ()
        return [("units", (*axis, slice(0, width))), ("extra", (*axis, slice(width, hidden)))]
    return [("all", (slice(None),))]
