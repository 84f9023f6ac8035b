"""Weights in and out of transformers' NanoChatForCausalLM (model_type "nanochat"), as plain dicts.

Our nanochat block (model/block=nanochat: rotary positions, weightless RMSNorm, one more right after
the token embedding, weightless per-head QK-norm, a relu2 MLP of two matrices, no biases) computes
what NanoChatForCausalLM computes, with a tied or untied head (tie_word_embeddings), any number of
key/value heads and an optional logit soft-cap (final_logit_softcapping). Two conventions differ,
and each converts exactly:

- transformers' nanochat turns rotary's channel pairs the other way: its rotate_half gives
  (x2, -x1) where ours (and Llama's) gives (-x2, x1), so it rotates by minus our angle. Negating the
  second half S of every query and key head turns one into the other: its rotation of S q is
  S times ours of q, and the dot products of queries with keys, both carrying S, are ours.
- it norms q and k after rotary, we before: a rotation keeps each head's norm, so both give the same.

- its norms have no gains. Ours may (norm_weight true; the embedding's norm never has one): a gain g
  on the norm before a matrix W is W's columns times g, since W (g * n(x)) = (W diag g) n(x). So ln_1's
  gain folds into c_attn, ln_2's into c_fc and ln_f's into the head, which a gain leaves untied.

The names change, c_attn's rows [q | k | v] split into q_proj, k_proj and v_proj, and the MLP's c_fc
and c_proj are fc1, fc2. A NanoChat read back has weightless norms: the same function, as the file holds it.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from model.config import NANOCHAT_BLOCK, GPTConfig

from .llama import (
    NANOCHAT,
    SHAPE_KEYS,
    TIED_HEAD,
    from_decoder,
    rotary_base,
    rotary_decoder_config,
    rotary_shape,
    tied,
    to_decoder,
    unsupported,
)

ARCHITECTURE = "NanoChatForCausalLM"
TRANSFORMERS_NEEDED = "5.0"  # the first release with NanoChatForCausalLM
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
EMBEDDING = {"transformer.wte.weight": "model.embed_tokens.weight"}


def config_to_nanochat(config: GPTConfig, eos_token_id: int | None) -> dict:
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


def config_from_nanochat(hf_config: dict) -> GPTConfig:
    """The GPTConfig of a NanoChat config.json (model_type "nanochat"), its MLP at the default
    width (hf/gpt2.py widens it); ValueError for one gptlab's block cannot reproduce, naming the settings."""
    problems = unsupported(hf_config, SHAPE_KEYS, SAME_FUNCTION)
    eps = hf_config.get("rms_norm_eps", DEFAULTS["rms_norm_eps"])
    if type(eps) not in (int, float) or not eps > 0:
        problems.append(f"rms_norm_eps={eps!r} (supported: a positive number)")
    cap = hf_config.get("final_logit_softcapping", DEFAULTS["final_logit_softcapping"])
    if cap is not None and (type(cap) not in (int, float) or not cap > 0):
        problems.append(f"final_logit_softcapping={cap!r} (supported: a positive number, or null)")
    theta = rotary_base(hf_config, problems)
    return GPTConfig(
        **rotary_shape(hf_config, theta),
        norm_eps=float(eps),
        logit_softcap=None if cap is None else float(cap),
        tie_embeddings=tied(hf_config, SAME_FUNCTION),
        **NANOCHAT_BLOCK,
    )


def to_nanochat(config: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Our nanochat-block state dict (a tied head left out) under NanoChatForCausalLM's names,
    its norms' gains folded into the matrices after them."""
    return to_decoder(as_stored(config), fold_gains(config, state), EMBEDDING, LAYER_NAMES, flip_rotary)


def as_stored(config: GPTConfig) -> GPTConfig:
    """The config a NanoChat export of `config` holds: weightless norms, the head untied where a
    final gain folds into it."""
    if not config.norm_weight:
        return config
    return replace(config, norm_weight=False, tie_embeddings=False)


def fold_gains(config: GPTConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """state with each norm's gain multiplied into the columns of the matrix that reads the norm
    (in float32, stored back in each matrix's dtype) and the gains left out; as it is without gains."""
    if not config.norm_weight:
        return state
    readers = {
        f"transformer.h.{i}.{norm}.weight": f"transformer.h.{i}.{matrix}.weight"
        for i in range(config.n_layer)
        for norm, matrix in (("ln_1", "attn.c_attn"), ("ln_2", "mlp.c_fc"))
    }
    readers["transformer.ln_f.weight"] = TIED_HEAD
    folded = {name: tensor for name, tensor in state.items() if name not in readers}
    folded.setdefault(TIED_HEAD, state["transformer.wte.weight"])  # a tied head becomes a matrix of its own
    for gain, matrix in readers.items():
        folded[matrix] = (folded[matrix].float() * state[gain].float()).to(folded[matrix].dtype)
    return folded


def from_nanochat(config: GPTConfig, hf_state: dict[str, Tensor]) -> dict[str, Tensor]:
    """NanoChatForCausalLM's state dict under our names, c_attn fused again. A tied model's stored
    lm_head must be the embedding itself. The names are checked before."""
    return from_decoder(config, hf_state, EMBEDDING, LAYER_NAMES, flip_rotary)


def flip_rotary(rows: Tensor, config: GPTConfig) -> Tensor:
    """A q or k projection's rows (heads * head_dim, n_embd) with the second half of every head
    negated: between our rotary's turn and transformers' nanochat's, either way (see the docstring)."""
    halves = rows.unflatten(0, (-1, 2, config.head_dim // 2))  # (heads, 2, head_dim / 2, n_embd)
    return torch.cat([halves[:, :1], -halves[:, 1:]], dim=1).flatten(0, 2)


def transformers_line(out_dir: str) -> str:
    """What an export says about loading it: the transformers release NanoChatForCausalLM needs,
    and whether the one installed here (if any) has it."""
    try:
        from transformers import NanoChatForCausalLM  # noqa: F401  (transformers >= 5.0)
    except ImportError:
        try:
            import transformers
        except ImportError:
            return (
                f"{out_dir}: transformers is not installed here; "
                f"NanoChatForCausalLM needs transformers >= {TRANSFORMERS_NEEDED}"
            )
        return (
            f"{out_dir}: transformers {transformers.__version__} here has no NanoChatForCausalLM: "
            f"load this directory with transformers >= {TRANSFORMERS_NEEDED}"
        )
    return f"{out_dir}: loads with transformers >= {TRANSFORMERS_NEEDED} (NanoChatForCausalLM)"
