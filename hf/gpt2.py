"""Weights in and out of Hugging Face's GPT-2 family, as plain dicts (no files here); Llama's (hf/llama.py) and
NanoChat's (hf/nanochat.py) by model_type.

Two architectures compute exactly what our GPT computes, both always with biases, lm_head being wte's matrix unless
tie_word_embeddings is false, and activation_function "relu2" computing our mlp=relu2:
- GPT2LMHeadModel (model_type "gpt2") for MHA: the same parameter names as ours, but its attention and MLP matrices
  are Conv1D weights stored (in, out), the transpose of nn.Linear's (out, in).
- GPTBigCodeForCausalLM (model_type "gpt_bigcode", multi_query=True) for MQA: nn.Linear layouts and a fused c_attn
  laid out [q | k | v] with one k/v head, exactly ours with n_kv_head=1.
GQA (1 < n_kv_head < n_head) has no equivalent in this family; `pool_kv_heads` makes GQA/MQA weights from MHA ones.
"""

from __future__ import annotations

import re
from dataclasses import replace

import torch
from torch import Tensor

from model.config import NORM_EPS, GPTConfig
from model.gpt import GPT
from model.state import TIED_HEAD, fit_problems, non_finite, shared_names

from . import llama, nanochat
from .llama import LLAMA, NANOCHAT, block_family, check_tied_head, split_qkv, tied

GPT2, BIGCODE = "gpt2", "gpt_bigcode"
ARCHITECTURE_CLASS = {GPT2: "GPT2LMHeadModel", BIGCODE: "GPTBigCodeForCausalLM"}
PREFIX = "transformer."
NO_BIAS = (PREFIX + "wte.weight", PREFIX + "wpe.weight", TIED_HEAD)  # weights without a bias in any family
FUSED_QKV = ("attn.c_attn.weight", "attn.c_attn.bias")
CONV1D_WEIGHTS = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Buffers that GPT-2 files written by older transformers carry: the causal mask and its fill value.
GPT2_BUFFERS = re.compile(r"\.attn\.(bias|masked_bias)$")
SHAPE_KEYS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
# activation_function -> our mlp: gelu_new and gelu_pytorch_tanh are both the tanh GELU.
ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "relu2": "relu2"}
# Settings under which a GPT-2-family model computes our function, by model_type: key ->
# (the config class's default when config.json omits it, the values that keep the function ours).
_BOTH = {
    "layer_norm_epsilon": (1e-5, (NORM_EPS,)),  # nn.LayerNorm's eps
    "scale_attn_weights": (True, (True,)),
    "add_cross_attention": (False, (False,)),
    "tie_word_embeddings": (True, (True, False)),  # read into tie_embeddings
}
GPT2_ONLY = {"scale_attn_by_inverse_layer_idx": (False, (False,))}
SAME_FUNCTION = {  # activation_function is read into mlp; GPTBigCode imports only as multi-query attention
    GPT2: {**_BOTH, "activation_function": ("gelu_new", (*ACTIVATIONS,)), **GPT2_ONLY},
    BIGCODE: {**_BOTH, "activation_function": ("gelu_pytorch_tanh", (*ACTIVATIONS,)), "multi_query": (True, (True,))},
}
# The rotary families by model_type, each module with DEFAULTS (its config class's defaults), read_config (config.json
# -> GPTConfig, the MLP at its default width), write_config and to_theirs / from_theirs (state dicts).
ROTARY = {LLAMA: llama, NANOCHAT: nanochat}


def config_from_hf(hf_config: dict) -> GPTConfig:
    """The GPTConfig of a GPT-2, GPTBigCode (multi-query), Llama or NanoChat config.json, with dropout 0.0 and
    attn_impl "sdpa" (neither changes the weights: dataclasses.replace sets them). ValueError for anything else."""
    kind = hf_config.get("model_type")
    if kind in ROTARY:
        width = hf_config.get("intermediate_size", ROTARY[kind].DEFAULTS["intermediate_size"])
        return _with_mlp_width(ROTARY[kind].read_config(hf_config), width, "intermediate_size")
    if kind not in ARCHITECTURE_CLASS:
        raise ValueError(
            f"config.json has model_type {kind!r}: gptlab imports GPT-2 ({GPT2!r}), "
            f"GPTBigCode ({BIGCODE!r}), Llama ({LLAMA!r}) and NanoChat ({NANOCHAT!r}) models only"
        )
    same_function = SAME_FUNCTION[kind]
    if problems := llama.unsupported(hf_config, SHAPE_KEYS, same_function):
        raise ValueError("config.json describes a model gptlab's GPT cannot reproduce: " + "; ".join(problems))
    config = GPTConfig(
        **{ours: hf_config[key] for key, ours in zip(SHAPE_KEYS, llama.SHAPE_FIELDS)},
        n_kv_head=1 if kind == BIGCODE else hf_config["n_head"],
        dropout=0.0,
        bias=True,
        mlp=ACTIVATIONS[hf_config.get("activation_function", same_function["activation_function"][0])],
        tie_embeddings=tied(hf_config, same_function),
    )
    return _with_mlp_width(config, hf_config.get("n_inner"), "n_inner")


def _with_mlp_width(config: GPTConfig, width: int | None, key: str) -> GPTConfig:
    """config with an MLP `width` wide (None: the default). Besides its default width (gelu: 4 * n_embd; swiglu: 2/3
    of that, rounded up to a multiple of 8), our MLP can only be as wide as match_mha_params makes it."""
    if width is None or width == config.mlp_hidden:
        return config
    widened = replace(config, match_mha_params=True)
    if width != widened.mlp_hidden:
        raise ValueError(
            f"config.json has {key}={width!r}: gptlab's {config.mlp} MLP is {config.mlp_hidden} wide, "
            f"or {widened.mlp_hidden} with match_mha_params"
        )
    return widened


def config_to_hf(config: GPTConfig, eos_token_id: int | None) -> dict:
    """config.json for `config` (block_family chooses the class; in GPT-2's block, GPT2LMHeadModel for MHA and
    GPTBigCodeForCausalLM for MQA), eos_token_id also its bos, as GPT-2's. U-net skips are refused: no transformers
    class computes them. Document masks export: they change no weight, and generation reads one document."""
    if config.unet_skips:
        raise ValueError(
            "model.unet_skips=True: no transformers class computes U-net skips, so this model does not export; "
            "train one without them"
        )
    if (family := block_family(config)) in ROTARY:
        return ROTARY[family].write_config(config, eos_token_id)
    if config.attention_kind == "GQA":
        raise ValueError(
            f"grouped-query attention (n_kv_head={config.kv_heads} of n_head={config.n_head}) has no "
            "GPT-2-family equivalent in transformers: GPT-2 is MHA (n_kv_head = n_head) and GPTBigCode "
            "is MQA (n_kv_head = 1); in GPT-2's block only those two export (in the Llama block, "
            "model/block=llama, GQA exports as LlamaForCausalLM)"
        )
    kind = GPT2 if config.attention_kind == "MHA" else BIGCODE
    gelu = SAME_FUNCTION[kind]["activation_function"][0]  # each class's own name for the tanh GELU
    return {
        "architectures": [ARCHITECTURE_CLASS[kind]],
        "model_type": kind,
        **{key: getattr(config, ours) for key, ours in zip(SHAPE_KEYS, llama.SHAPE_FIELDS)},
        "n_inner": config.mlp_hidden,
        "activation_function": gelu if config.mlp == "gelu" else config.mlp,
        **({"multi_query": True} if kind == BIGCODE else {}),
        "layer_norm_epsilon": NORM_EPS,
        **dict.fromkeys(("resid_pdrop", "embd_pdrop", "attn_pdrop"), config.dropout),
        "tie_word_embeddings": config.tie_embeddings,
        **dict.fromkeys(("bos_token_id", "eos_token_id"), eos_token_id),
    }


def from_hf(hf_config: dict, hf_state: dict[str, Tensor]) -> tuple[GPTConfig, dict[str, Tensor]]:
    """A transformers GPT-2 / GPTBigCode (MQA) / Llama / NanoChat model as our (GPTConfig, state dict), a tied one
    without lm_head.weight, like our checkpoints. ValueError when the weights do not fit the config or are not finite
    (a damaged file, refused at import rather than found as a diverging loss)."""
    config, kind = config_from_hf(hf_config), hf_config["model_type"]
    if broken := non_finite({name: tensor for name, tensor in hf_state.items() if not GPT2_BUFFERS.search(name)}):
        raise ValueError(f"the weights hold NaN or infinite values, in {broken}")
    meta = {name: torch.empty(shape, device="meta") for name, shape in parameter_shapes(config).items()}
    if kind in ROTARY:
        named, expected = hf_state, ROTARY[kind].to_theirs(config, meta)
    else:  # files saved from GPT2Model (like OpenAI's originals) lack the "transformer." prefix
        prefixed = {key if key.startswith((PREFIX, "lm_head.")) else PREFIX + key: t for key, t in hf_state.items()}
        named = {name: tensor for name, tensor in prefixed.items() if not GPT2_BUFFERS.search(name)}
        expected = {name: _hf_layout(name, tensor, kind == GPT2) for name, tensor in meta.items()}
    own = {name: tensor for name, tensor in named.items() if name not in shared_names(config)}
    _check_fit(own, {name: tensor.shape for name, tensor in expected.items()}, "config.json")
    if kind in ROTARY:
        return config, ROTARY[kind].from_theirs(config, hf_state)
    check_tied_head(config, named, PREFIX + "wte.weight")
    return config, {name: _hf_layout(name, tensor, kind == GPT2).contiguous() for name, tensor in own.items()}


def to_hf(config: GPTConfig, state: dict[str, Tensor], eos_token_id: int | None) -> tuple[dict, dict[str, Tensor]]:
    """Our (GPTConfig, state dict) as a transformers (config.json dict, state dict). In the GPT-2 family, which always
    has biases, a bias=False model gets zero ones. ValueError for a block no class computes or ill-fitting weights."""
    hf_config = config_to_hf(config, eos_token_id)
    kind = hf_config["model_type"]
    state = {name: tensor for name, tensor in state.items() if name not in shared_names(config)}
    _check_fit(state, parameter_shapes(config), "the model config")
    if kind in ROTARY:
        return hf_config, ROTARY[kind].to_theirs(config, state)
    biased = _with_zero_biases(state)
    return hf_config, {name: _hf_layout(name, t, kind == GPT2).contiguous() for name, t in biased.items()}


def pool_kv_heads(state: dict[str, Tensor], config: GPTConfig, n_kv_head: int) -> tuple[GPTConfig, dict[str, Tensor]]:
    """Fewer key/value heads (n_kv_head must divide the model's), each new K and V head the mean of the heads in its
    group, weights and biases (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from
    Multi-Head Checkpoints"). Query head h keeps reading the group of its old kv head, so groups of identical heads
    pool without loss; otherwise the model needs a little further training ("uptraining") to recover."""
    # Pooling leaves the MLP as it is: 4 * n_embd wide, not widened for the new head count.
    target = replace(config, n_kv_head=n_kv_head, match_mha_params=False)  # validates n_kv_head
    if config.kv_heads % n_kv_head:
        raise ValueError(
            f"cannot pool {config.kv_heads} key/value heads into {n_kv_head}: "
            f"n_kv_head must divide the current {config.kv_heads}"
        )
    if target.mlp_hidden != config.mlp_hidden:
        raise ValueError(f"cannot pool a model whose MLP match_mha_params widened ({config.mlp_hidden} wide)")
    group = config.kv_heads // n_kv_head

    def pool(fused: Tensor) -> Tensor:
        # (n_kv_head_old * hd, ...) -> (n_kv_head, group, hd, ...) -> mean over group
        q, k, v = split_qkv(fused, config)
        kv = [heads.unflatten(0, (n_kv_head, group, config.head_dim)).mean(dim=1).flatten(0, 1) for heads in (k, v)]
        return torch.cat([q, *kv])

    return target, {name: pool(tensor) if name.endswith(FUSED_QKV) else tensor for name, tensor in state.items()}


def crop_block_size(
    state: dict[str, Tensor], config: GPTConfig, block_size: int
) -> tuple[GPTConfig, dict[str, Tensor]]:
    """A shorter context: the first block_size rows of the position table (rotary has none); every sequence of at
    most block_size tokens gets the same logits as before."""
    if not 0 < block_size <= config.block_size:
        raise ValueError(f"block_size {block_size} must be in [1, {config.block_size}], the model's context")
    wpe = PREFIX + "wpe.weight"
    cropped = {wpe: state[wpe][:block_size].clone()} if wpe in state else {}
    return replace(config, block_size=block_size), {**state, **cropped}


def parameter_shapes(config: GPTConfig) -> dict[str, torch.Size]:
    """Our parameter names and shapes for `config`, without a tied head."""
    shapes = GPT.shapes_only(config).state_dict()
    return {name: tensor.shape for name, tensor in shapes.items() if name not in shared_names(config)}


def _hf_layout(name: str, tensor: Tensor, transposed: bool) -> Tensor:
    """Between our layout and GPT-2's, either way: its Conv1D matrices are (in, out), nn.Linear's (out, in)."""
    return tensor.t() if transposed and name.endswith(CONV1D_WEIGHTS) else tensor


def _with_zero_biases(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """state with a zero bias for every Linear and LayerNorm weight lacking one (not the head's)."""
    biased = dict(state)
    for name, weight in state.items():
        bias = name.removesuffix(".weight") + ".bias"
        if name.endswith(".weight") and name not in NO_BIAS and bias not in state:
            biased[bias] = weight.new_zeros(weight.shape[0])  # (out_features,) or (n_embd,)
    return biased


def _check_fit(state: dict[str, Tensor], expected: dict[str, torch.Size], against: str) -> None:
    """ValueError naming what is missing, unexpected or differently shaped."""
    if problems := fit_problems(state, expected, "the weights", against):
        raise ValueError(f"the weights do not fit {against}: {problems}")
