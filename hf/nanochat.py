"""Weights in and out of transformers' NanoChatForCausalLM (model_type "nanochat"), as plain dicts.

Our nanochat block (model/block=nanochat: rotary, weightless RMSNorms, one more after the token embedding, weightless
per-head QK-norm, a relu2 MLP of two matrices, no biases) computes what NanoChatForCausalLM computes, with a tied or
untied head, any number of key/value heads and an optional logit soft-cap. What differs converts exactly:
- its rotate_half gives (x2, -x1) where ours (and Llama's) gives (-x2, x1): it rotates by minus our angle. Negating
  the second half S of every query and key head turns one into the other: its rotation of S q is S times ours of q,
  and S cancels in the dot products of queries with keys.
- it norms q and k after rotary, we before: a rotation keeps each head's norm, so both give the same.
- its norms are weightless RMSNorms; ours may have gains (norm_weight), be LayerNorms (without biases), and the
  blocks' writes may be scaled (branch_scale): each folds into the weights. A gain g before a matrix W is W's columns
  times g (ln_1's into c_attn, ln_2's into c_fc, ln_f's into the head). A LayerNorm is an RMSNorm of the centred
  vector: with the embedding's rows and every write into the stream (c_proj's columns) centred, NanoChat's stream is
  ours centred, and each of its RMSNorms our LayerNorm. branch_scale multiplies c_proj. The head, where a gain or the
  centring changes the embedding, is a matrix of its own (untied).
c_attn's rows [q | k | v] split into q_proj, k_proj and v_proj; c_fc and c_proj are fc1 and fc2. A NanoChat read back
has weightless RMSNorms: the same function, as the file holds it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from model.config import NANOCHAT_BLOCK, GPTConfig
from model.state import TIED_HEAD

from . import llama
from .llama import NANOCHAT, SHAPE_KEYS, rotary_base, rotary_decoder_config, rotary_shape, tied, unsupported

ARCHITECTURE = "NanoChatForCausalLM"
NEEDED = "5.0"  # the first release with NanoChatForCausalLM
# NanoChat settings under which it computes our function: key -> (transformers' default, allowed values).
SAME_FUNCTION = {
    "hidden_act": ("relu2", ("relu2",)),
    "attention_bias": (False, (False,)),
    "tie_word_embeddings": (False, (True, False)),  # read into tie_embeddings
}
# NanoChatConfig's defaults for the other keys gptlab reads.
DEFAULTS = {"intermediate_size": 8192, "rms_norm_eps": 1e-6, "final_logit_softcapping": 15.0}
# Our names after "transformer.h.<i>." -> NanoChat's after "model.layers.<i>." (c_attn is split apart).
LAYER_NAMES = {
    "attn.c_proj.weight": "self_attn.o_proj.weight",
    "mlp.c_fc.weight": "mlp.fc1.weight",
    "mlp.c_proj.weight": "mlp.fc2.weight",
}
WTE = "transformer.wte.weight"


def flip_rotary(rows: Tensor, config: GPTConfig) -> Tensor:
    """A q or k projection's rows (heads * head_dim, n_embd) with the second half of every head
    negated: between our rotary's turn and transformers' nanochat's, either way (see the docstring)."""
    halves = rows.unflatten(0, (-1, 2, config.head_dim // 2))  # (heads, 2, head_dim / 2, n_embd)
    return torch.cat([halves[:, :1], -halves[:, 1:]], dim=1).flatten(0, 2)


LAYOUT = llama.Layout({WTE: "model.embed_tokens.weight"}, LAYER_NAMES, flip_rotary)


def write_config(config: GPTConfig, eos_token_id: int | None) -> dict:
    """config.json of a NanoChatForCausalLM computing our nanochat-block `config`."""
    config = as_stored(config)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": NANOCHAT,
        **rotary_decoder_config(config, eos_token_id),
        "hidden_act": "relu2",
        "rms_norm_eps": config.norm_eps,
        "final_logit_softcapping": config.logit_softcap,  # null: none (NanoChatConfig's default is 15)
        "pad_token_id": eos_token_id,  # NanoChatConfig's default, 1, is a token of ours
    }


def read_config(hf_config: dict) -> GPTConfig:
    """The GPTConfig of a NanoChat config.json, its MLP at the default width (hf/gpt2.py widens it), else ValueError."""
    problems = unsupported(hf_config, SHAPE_KEYS, SAME_FUNCTION)
    eps = hf_config.get("rms_norm_eps", DEFAULTS["rms_norm_eps"])
    if type(eps) not in (int, float) or not eps > 0:
        problems.append(f"rms_norm_eps={eps!r} (supported: a positive number)")
    cap = hf_config.get("final_logit_softcapping", DEFAULTS["final_logit_softcapping"])
    if cap is not None and (type(cap) not in (int, float) or not cap > 0):
        problems.append(f"final_logit_softcapping={cap!r} (supported: a positive number, or null)")
    shape = rotary_shape(hf_config, rotary_base(hf_config, problems))
    cap, tie = None if cap is None else float(cap), tied(hf_config, SAME_FUNCTION)
    return GPTConfig(**shape, norm_eps=float(eps), logit_softcap=cap, tie_embeddings=tie, **NANOCHAT_BLOCK)


def to_theirs(config: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our nanochat-block state dict (a tied head left out) under NanoChatForCausalLM's names, folded."""
    return llama.to_theirs(as_stored(config), fold(config, state), LAYOUT)


def as_stored(config: GPTConfig) -> GPTConfig:
    """The config a NanoChat export of `config` holds (see the docstring)."""
    tied = config.tie_embeddings and not (config.norm_weight or config.norm == "layernorm")  # else its own head
    return replace(config, norm="rmsnorm", norm_weight=False, branch_scale=1.0, tie_embeddings=tied)


def fold(config: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our state dict as as_stored(config)'s: gains, centring and branch_scale folded into the
    matrices (see the docstring), computed in float32 and stored in each matrix's dtype."""
    center = config.norm == "layernorm"

    def centred(weight: Tensor, dim: int) -> Tensor:
        weight = weight.float()
        return weight - weight.mean(dim, keepdim=True) if center else weight

    changed = {TIED_HEAD: state.get(TIED_HEAD, state[WTE]).float(), WTE: centred(state[WTE], 1)}  # a row: a token
    for i in range(config.n_layer):
        block = f"transformer.h.{i}."
        for proj in ("attn.c_proj.weight", "mlp.c_proj.weight"):  # (n_embd, inputs): a column is one write
            changed[block + proj] = config.branch_scale * centred(state[block + proj], 0)
        if config.norm_weight:
            for norm, matrix in (("ln_1.weight", "attn.c_attn.weight"), ("ln_2.weight", "mlp.c_fc.weight")):
                changed[block + matrix] = state[block + matrix] * state[block + norm].float()
    if config.norm_weight:
        changed[TIED_HEAD] = changed[TIED_HEAD] * state["transformer.ln_f.weight"].float()
    folded = {name: t for name, t in state.items() if not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))}
    folded |= {name: tensor.to(state[name if name in state else WTE].dtype) for name, tensor in changed.items()}
    return folded  # a head still tied stays out of the export: llama.to_theirs writes lm_head only untied


def from_theirs(config: GPTConfig, hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """NanoChatForCausalLM's state dict under our names (llama.from_theirs)."""
    return llama.from_theirs(config, hf_state, LAYOUT)


def transformers_line(out_dir: str) -> str:
    """What an export says about loading it: the transformers release NanoChatForCausalLM needs,
    and whether the one installed here (if any) has it."""
    try:
        import transformers
    except ImportError:
        return f"{out_dir}: transformers is not installed here; {ARCHITECTURE} needs transformers >= {NEEDED}"
    try:
        from transformers import NanoChatForCausalLM  # noqa: F401  (transformers >= 5.0)
    except ImportError:
        return (
            f"{out_dir}: transformers {transformers.__version__} here has no {ARCHITECTURE}: "
            f"load this directory with transformers >= {NEEDED}"
        )
    return f"{out_dir}: loads with transformers >= {NEEDED} ({ARCHITECTURE})"
