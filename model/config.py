"""GPTConfig: the shape of a model, validated the moment it is built; and the block presets.

BLOCKS sets each of BLOCK_SETTINGS (and bias where its family fixes it) by preset name: GPT-2's, Llama's, the
modern recipe's (GPT-2's with rotary, ReLU² and QK-norm) and nanochat's, each what its transformers class computes.
hf/llama.py picks an export family from them. Hydra composes `model/block=<name>` from conf/model/block/<name>.yaml,
which says the same in YAML (tests/test_config.py checks both agree), so model/ stays free of Hydra.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from rules import above, at_least, between, check_rules, one_of, setting

ATTENTION_IMPLS = ("sdpa", "manual")
POSITIONS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "relu2")
NORM_EPS = 1e-5  # GPT-2's LayerNorm and Llama's rms_norm_eps: norm_eps's default
# The block presets (see the module's docstring); GPT-2's and the modern one leave bias to the size preset.
BLOCK_SETTINGS = ("position", "norm", "norm_weight", "embed_norm", "branch_scale", "mlp", "qk_norm")  # every preset's
PLAIN_NORMS = {"norm_weight": True, "embed_norm": False, "branch_scale": 1.0}  # gains, no embedding norm
GPT2_BLOCK = {"position": "learned", "norm": "layernorm", **PLAIN_NORMS, "mlp": "gelu", "qk_norm": False}
LLAMA_BLOCK = {"position": "rope", "norm": "rmsnorm", **PLAIN_NORMS, "mlp": "swiglu", "qk_norm": False, "bias": False}
MODERN_BLOCK = {"position": "rope", "norm": "layernorm", **PLAIN_NORMS, "mlp": "relu2", "qk_norm": True}
# nanochat's (transformers' NanoChatForCausalLM): every norm a weightless RMSNorm, one more after
# the embedding, per-head QK-norm, relu2, no biases. The head's tying and soft-cap are left open.
NANOCHAT_BLOCK = {**LLAMA_BLOCK, "norm_weight": False, "embed_norm": True, "mlp": "relu2", "qk_norm": True}
BLOCKS = {"gpt2": GPT2_BLOCK, "llama": LLAMA_BLOCK, "modern": MODERN_BLOCK, "nanochat": NANOCHAT_BLOCK}  # model/block=


@dataclass
class GPTConfig:
    """The shape of a model; train.py starts from the preset model= chooses."""

    vocab_size: int = setting(50304, at_least(1))
    """Token ids the embedding covers; train.py sets it from the tokenizer (padded to pad_vocab_to) and refuses another."""
    block_size: int = setting(1024, at_least(1))
    """Longest sequence the position table covers (the context)."""
    n_layer: int = setting(12, at_least(1))
    """Transformer blocks."""
    n_head: int = setting(12, at_least(1))
    """Query heads per attention layer."""
    n_kv_head: int | None = setting(None, at_least(1))
    """Key/value heads: null (as many as n_head) is MHA, 1 is MQA, any other divisor of n_head is GQA."""
    n_embd: int = setting(768, at_least(1))
    """Width of the residual stream."""
    dropout: float = setting(0.0, between(0, 1, "[)"))
    """Dropout on attention weights, residual branches and embeddings."""
    bias: bool = True
    """Biases in Linear and LayerNorm layers, as in GPT-2."""
    attn_impl: str = setting("sdpa", one_of(*ATTENTION_IMPLS))
    """sdpa: torch's fused kernels; manual: explicit mask and softmax, which can return the weights."""
    match_mha_params: bool = False
    """Widen the MLP by what smaller key/value projections save, so GQA/MQA match MHA's size."""
    position: str = setting("learned", one_of(*POSITIONS))
    """learned: GPT-2's position table (wpe); rope: rotary embeddings on queries and keys, as in Llama."""
    rope_base: float = setting(10000.0, between(0, math.inf, "()"))
    """Base of rotary's frequencies (Llama's rope_theta); read only when position is rope."""
    norm: str = setting("layernorm", one_of(*NORMS))
    """layernorm: GPT-2's LayerNorm; rmsnorm: RMSNorm with a weight only, as in Llama."""
    norm_weight: bool = True
    """The norms learn a gain (and LayerNorm a bias, with bias); false: weightless norms, as in nanochat,
    the matrix after each norm learning the scale a gain would."""
    norm_eps: float = setting(NORM_EPS, above(0))
    """The epsilon every norm adds to the mean square (or variance): the blocks', the final one,
    embed_norm's and qk_norm's; 1e-5 is GPT-2's and Llama's."""
    embed_norm: bool = False
    """A norm (model.norm, without a gain) of the embeddings before the first block, as in nanochat."""
    branch_scale: float = setting(1.0, between(0, math.inf, "()"))
    """Multiplies what each attention and MLP adds to the residual stream. With embed_norm the embedding
    enters at size 1, not at its table's 0.02; a branch_scale of 50 gives the blocks' writes back the weight
    they have beside an unnormed embedding (under Adam, the same training as scaling the embedding by 1/50).
    Exports fold it into the projections' weights."""
    mlp: str = setting("gelu", one_of(*MLPS))
    """gelu: GPT-2's two-matrix MLP; swiglu: gate, up and down matrices, as in Llama, about 2/3 as wide;
    relu2: GPT-2's two matrices with relu(x)**2 in place of GELU, as in modded-nanogpt."""
    qk_norm: bool = False
    """RMSNorm of each head's queries and keys, before rotary, as in modded-nanogpt: without a weight, since
    a gain on q and k only rescales the attention logits, which W_q and W_k can do themselves (nanochat
    norms after rotary: the same, as a rotation keeps the norm)."""
    zero_init_proj: bool = False
    """Start the projections into the residual stream (attn.c_proj, mlp.c_proj) at zero, as in modded-nanogpt:
    each block begins as the identity; every other weight draws as without it."""
    tie_embeddings: bool = True
    """The LM head reuses the token table's matrix, as in GPT-2; false gives the head its own weight, drawn
    normal(0, 0.02) like every Linear (modded-nanogpt zeroes it; here zero starts are zero_init_proj's alone,
    so each setting changes one thing)."""
    logit_softcap: float | None = setting(None, above(0))
    """Cap the logits smoothly at +-c: c * tanh(logits / c) (modded-nanogpt); null: no cap."""
    document_masks: bool = False
    """Attention stays inside each document of a window (<|endoftext|> opens one) and positions restart at
    its start, so each is computed as if alone (model/documents.py); generation is one document."""
    eot_id: int | None = setting(None, at_least(0))
    """The token that opens each document (the tokenizer's <|endoftext|>); train.py sets it for document_masks."""
    unet_skips: bool = False
    """U-net skips (modded-nanogpt): block i's output for i < n_layer // 2 is added, times a learned weight
    (skip_weights, from 1), to the input of block n_layer - 1 - i."""

    def __post_init__(self) -> None:
        check_rules(self, "model.", self._conflicts)

    def _conflicts(self) -> Iterator[str]:
        if self.n_embd % self.n_head:
            yield f"model.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})"
        if self.n_head % self.kv_heads:
            yield (
                f"model.n_kv_head ({self.n_kv_head}) must divide n_head ({self.n_head}): "
                "each key/value head serves an equal group of query heads"
            )
        if self.position != "rope" and self.rope_base != GPTConfig.rope_base:  # it would be ignored without a word
            yield (
                f"model.rope_base ({self.rope_base:g}) is read only when position is rope, and "
                f"position is {self.position}: set model.position=rope too, or leave rope_base unset"
            )
        if self.eot_id is not None and self.eot_id >= self.vocab_size:
            yield f"model.eot_id ({self.eot_id}) must be a token id, below vocab_size ({self.vocab_size})"
        if self.position == "rope" and self.head_dim % 2:
            yield (
                f"model.position=rope needs an even head_dim (n_embd / n_head = {self.head_dim}): "
                "rotary turns channels in pairs"
            )

    @property
    def kv_heads(self) -> int:
        """n_kv_head, or n_head when that is None."""
        return self.n_head if self.n_kv_head is None else self.n_kv_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_base_hidden(self) -> int:
        """The MLP's hidden width before match_mha_params: 4 * n_embd; for swiglu 2/3 of that rounded up to
        a multiple of 8, so its three matrices hold about GELU's two's parameters."""
        return 8 * -(-8 * self.n_embd // 24) if self.mlp == "swiglu" else 4 * self.n_embd

    @property
    def mlp_hidden(self) -> int:
        """The MLP's hidden width: mlp_base_hidden, widened when match_mha_params."""
        if not self.match_mha_params:
            return self.mlp_base_hidden
        row = self.n_embd + self.bias
        # Per layer, each key/value head fewer saves a head_dim-wide slice of K and of V; each hidden unit
        # costs a row (and bias) of c_fc, and of c_gate for swiglu, and a column of c_proj.
        saved = 2 * (self.n_head - self.kv_heads) * self.head_dim * row
        return self.mlp_base_hidden + round(saved / ((2 if self.mlp == "swiglu" else 1) * row + self.n_embd))

    @property
    def attention_kind(self) -> str:
        """'MHA', 'MQA' or 'GQA', as the head counts make it."""
        return "MHA" if self.kv_heads == self.n_head else "MQA" if self.kv_heads == 1 else "GQA"
