"""Weights in and out of Hugging Face's LlamaForCausalLM, as plain dicts (no files here).

Our Llama block (position=rope, norm=rmsnorm, mlp=swiglu, bias=false) computes what LlamaForCausalLM computes with
tied or untied embeddings, any number of key/value heads, rotary in the rotate-half layout and RMSNorm with eps 1e-5.
Both use nn.Linear: only the names change, and our fused c_attn rows [q | k | v] split into q_proj, k_proj and v_proj.
block_family, here, decides which family a model exports as: GPT-2's, Llama's or NanoChat's (hf/nanochat.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from model.config import GPT2_BLOCK, LLAMA_BLOCK, NANOCHAT_BLOCK, NORM_EPS, GPTConfig
from model.state import TIED_HEAD

LLAMA, NANOCHAT = "llama", "nanochat"
SHAPE_KEYS = ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads")
SHAPE_FIELDS = ("vocab_size", "block_size", "n_embd", "n_layer", "n_head")  # GPTConfig's, for any family's SHAPE_KEYS
# Llama settings under which it computes our function: key -> (transformers' default, allowed values).
SAME_FUNCTION = {
    "hidden_act": ("silu", ("silu",)),
    "rms_norm_eps": (1e-6, (NORM_EPS,)),
    "attention_bias": (False, (False,)),
    "mlp_bias": (False, (False,)),
    "tie_word_embeddings": (False, (True, False)),  # read into tie_embeddings
    "pretraining_tp": (1, (1,)),
}
# LlamaConfig's defaults for the other keys gptlab reads: the MLP width and the rotary base
# (head_dim and num_key_value_heads default to what the other sizes give, as in LlamaConfig).
DEFAULTS = {"intermediate_size": 11008, "rope_theta": 10000.0, "rope_type": "default"}
# Our names after "transformer.h.<i>." -> Llama's after "model.layers.<i>." (c_attn is split apart).
LAYER_NAMES = {
    "ln_1.weight": "input_layernorm.weight",
    "attn.c_proj.weight": "self_attn.o_proj.weight",
    "ln_2.weight": "post_attention_layernorm.weight",
    "mlp.c_gate.weight": "mlp.gate_proj.weight",
    "mlp.c_fc.weight": "mlp.up_proj.weight",
    "mlp.c_proj.weight": "mlp.down_proj.weight",
}
QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
FUSED = "attn.c_attn.weight"
OUTSIDE = {"transformer.wte.weight": "model.embed_tokens.weight", "transformer.ln_f.weight": "model.norm.weight"}
# The settings under which each family's transformers classes compute our block: the values allowed. GPT-2's classes
# take relu2 as their activation_function as well as GELU; Llama's MLP is gated (SwiGLU) only. Neither has weightless
# norms, an embedding norm, QK-norm or a soft-cap, and gptlab writes their norms' eps as 1e-5; NanoChat's has all four
# and takes any eps, and its gains, LayerNorm and any branch_scale fold into the weights (hf/nanochat.py).
PLAIN = {"logit_softcap": (None,), "norm_eps": (NORM_EPS,), "branch_scale": (1.0,)}
FOLDS = {"norm": ("rmsnorm", "layernorm"), "norm_weight": (False, True)}
FAMILY_BLOCKS = {  # NanoChat before Llama: the nearer when equal
    "gpt2": {**{key: (value,) for key, value in GPT2_BLOCK.items()}, "mlp": ("gelu", "relu2"), **PLAIN},
    NANOCHAT: {**{key: (value,) for key, value in NANOCHAT_BLOCK.items() if key != "branch_scale"}, **FOLDS},
    LLAMA: {**{key: (value,) for key, value in LLAMA_BLOCK.items()}, **PLAIN},
}
# What turns the modern recipe's block into one NanoChatForCausalLM computes (docs/huggingface.md).
NANOCHAT_MODERN = ("model.embed_norm=true", "model.branch_scale=50")
FAMILY_NAMES = {"gpt2": "GPT2LMHeadModel", LLAMA: "LlamaForCausalLM", NANOCHAT: "NanoChatForCausalLM"}


def block_family(config: GPTConfig) -> str:
    """'gpt2', 'llama' or 'nanochat': the transformers family that computes config's block. Any other block is refused,
    naming what the nearest family (the same position encoding first, then the fewest settings off) needs."""
    off = {
        family: [key for key, values in allowed.items() if getattr(config, key) not in values]
        for family, allowed in FAMILY_BLOCKS.items()
    }
    nearest = min(off, key=lambda family: (config.position not in FAMILY_BLOCKS[family]["position"], len(off[family])))
    if off[nearest]:
        needs = [f"{key}={' or '.join(map(repr, FAMILY_BLOCKS[nearest][key]))}" for key in off[nearest]]
        raise ValueError(
            f"{', '.join(f'model.{key}={getattr(config, key)!r}' for key in off[nearest])} with "
            f"model.position={config.position!r} is a block no transformers class computes: "
            f"{FAMILY_NAMES[nearest]} needs {', '.join(needs)} (model/block={nearest}); the blocks that export are "
            f"{', '.join(f'model/block={f}' for f in FAMILY_BLOCKS)}, and the default block trained with "
            f"{' '.join(NANOCHAT_MODERN)} (NanoChatForCausalLM)"
        )
    return nearest


def write_config(config: GPTConfig, eos_token_id: int | None) -> dict:
    """config.json of a LlamaForCausalLM computing our Llama-block `config`."""
    return {
        "architectures": [FAMILY_NAMES[LLAMA]],
        "model_type": LLAMA,
        **rotary_decoder_config(config, eos_token_id),
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": NORM_EPS,
        "mlp_bias": False,
    }


def rotary_decoder_config(config: GPTConfig, eos_token_id: int | None) -> dict:
    """The config.json keys Llama and NanoChat share: shape, rotary, attention biases, dropout, tying, end of text."""
    return {
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.block_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.mlp_hidden,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.kv_heads,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_base},
        "attention_bias": False,
        "attention_dropout": config.dropout,
        "tie_word_embeddings": config.tie_embeddings,
        **dict.fromkeys(("bos_token_id", "eos_token_id"), eos_token_id),
    }


def unsupported(hf_config: dict, shape_keys: tuple[str, ...], same_function: dict) -> list[str]:
    """For any family's config.json: ValueError when a size in shape_keys is missing or not an integer (GPTConfig
    trusts its types), else a line for each setting under which the model computes another function than ours."""
    if missing := [key for key in shape_keys if key not in hf_config]:
        raise ValueError(f"config.json lacks {', '.join(missing)}")
    if not_counts := [f"{key}={hf_config[key]!r}" for key in shape_keys if type(hf_config[key]) is not int]:
        raise ValueError(f"config.json's sizes must be integers: {', '.join(not_counts)}")
    return [
        f"{key}={hf_config.get(key, default)!r} (supported: {', '.join(map(repr, allowed))})"
        for key, (default, allowed) in same_function.items()
        if hf_config.get(key, default) not in allowed
    ]


def tied(hf_config: dict, same_function: dict) -> bool:
    """config.json's tie_word_embeddings, or the family's default when it is left out."""
    return bool(hf_config.get("tie_word_embeddings", same_function["tie_word_embeddings"][0]))


def read_config(hf_config: dict) -> GPTConfig:
    """The GPTConfig of a Llama config.json, its MLP at the default width (hf/gpt2.py widens it), else ValueError."""
    theta = rotary_base(hf_config, unsupported(hf_config, SHAPE_KEYS, SAME_FUNCTION))
    return GPTConfig(**rotary_shape(hf_config, theta), tie_embeddings=tied(hf_config, SAME_FUNCTION), **LLAMA_BLOCK)


def rotary_base(hf_config: dict, problems: list[str]) -> float:
    """The rotary base of Llama's and NanoChat's config.json (sizes checked by `unsupported`, its lines in problems);
    ValueError naming every setting gptlab cannot reproduce: those, rotary scaling, a base that is no positive number,
    a head_dim of its own. transformers 4.x's rope_scaling, when set, replaces 5's rope_parameters, whose rope_theta
    comes before the top level's (4.x) and rope_type before its 4.x spelling "type"."""
    key = "rope_scaling" if hf_config.get("rope_scaling") else "rope_parameters"
    rope = hf_config.get(key) or {}
    if not isinstance(rope, dict):
        raise ValueError(f"config.json's {key} is not a JSON object: {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", DEFAULTS["rope_type"]))
    if rope_type != "default":
        problems.append(f"rotary scaling rope_type={rope_type!r} (supported: 'default', no scaling)")
    theta = rope.get("rope_theta", hf_config.get("rope_theta", DEFAULTS["rope_theta"]))
    if type(theta) not in (int, float) or not 0 < theta < math.inf:
        problems.append(f"rope_theta={theta!r} (supported: a positive number)")
    n_embd, n_head, head_dim = hf_config["hidden_size"], hf_config["num_attention_heads"], hf_config.get("head_dim")
    if n_embd % n_head:
        problems.append(f"hidden_size={n_embd} is not a multiple of num_attention_heads={n_head}")
    elif head_dim is not None and head_dim != n_embd // n_head:
        problems.append(f"head_dim={head_dim!r} (supported: hidden_size / num_attention_heads = {n_embd // n_head})")
    if problems:
        raise ValueError("config.json describes a model gptlab's GPT cannot reproduce: " + "; ".join(problems))
    return float(theta)


def rotary_shape(hf_config: dict, theta: float) -> dict:
    """GPTConfig's shape settings from a Llama or NanoChat config.json that rotary_base checked."""
    shape = {ours: hf_config[key] for key, ours in zip(SHAPE_KEYS, SHAPE_FIELDS)}
    return shape | dict(n_kv_head=hf_config.get("num_key_value_heads") or shape["n_head"], dropout=0.0, rope_base=theta)


class Layout(NamedTuple):
    """A Llama-like family's names: `outside` the blocks, `layers` in each after "model.layers.<i>." (c_attn split
    into QKV), and what converts the q and k rows, either way (Llama's: nothing)."""

    outside: dict[str, str]
    layers: dict[str, str]
    turn_qk: Callable[[Tensor, GPTConfig], Tensor] = lambda rows, config: rows


LLAMA_LAYOUT = Layout(OUTSIDE, LAYER_NAMES)


def to_theirs(config: GPTConfig, state: dict[str, Tensor], layout: Layout = LLAMA_LAYOUT) -> dict[str, Tensor]:
    """Our state dict under LlamaForCausalLM's names, or those of another `layout`; a tied head left out."""
    named = {theirs: state[ours] for ours, theirs in layout.outside.items()}
    if not config.tie_embeddings:
        named[TIED_HEAD] = state[TIED_HEAD]  # the same name in both
    for layer in range(config.n_layer):
        ours, theirs = f"transformer.h.{layer}.", f"model.layers.{layer}."
        named |= {theirs + name: state[ours + name_ours] for name_ours, name in layout.layers.items()}
        q, k, v = split_qkv(state[ours + FUSED], config)
        named |= dict(zip((theirs + name for name in QKV), (layout.turn_qk(q, config), layout.turn_qk(k, config), v)))
    return named


def from_theirs(config: GPTConfig, hf_state: dict[str, Tensor], layout: Layout = LLAMA_LAYOUT) -> dict[str, Tensor]:
    """to_theirs's inverse (the names checked before); a tied model's stored lm_head must be the embedding itself."""
    check_tied_head(config, hf_state, layout.outside["transformer.wte.weight"])
    named = {ours: hf_state[theirs] for ours, theirs in layout.outside.items()}
    if not config.tie_embeddings:
        named[TIED_HEAD] = hf_state[TIED_HEAD]
    for layer in range(config.n_layer):
        ours, theirs = f"transformer.h.{layer}.", f"model.layers.{layer}."
        named |= {ours + name_ours: hf_state[theirs + name] for name_ours, name in layout.layers.items()}
        q, k, v = (hf_state[theirs + name] for name in QKV)
        named[ours + FUSED] = torch.cat([layout.turn_qk(q, config), layout.turn_qk(k, config), v])
    return named


def check_tied_head(config: GPTConfig, hf_state: dict[str, Tensor], embedding: str) -> None:
    """ValueError when config ties the head but hf_state stores another matrix as lm_head.weight (two models)."""
    head = hf_state.get(TIED_HEAD)
    if config.tie_embeddings and head is not None and not torch.equal(head, hf_state[embedding]):
        raise ValueError(f"{TIED_HEAD} differs from {embedding}, but config.json ties them (tie_word_embeddings)")


def split_qkv(fused: Tensor, config: GPTConfig) -> tuple[Tensor, ...]:
    """c_attn's rows [q | k | v] as three matrices."""
    kv_dim = config.kv_heads * config.head_dim
    return tuple(part.contiguous() for part in fused.split((config.n_embd, kv_dim, kv_dim)))
