"""The speedrun's model pieces (issue 48): document masks and U-net skips,
each against a reference written out here: a document alone, the model without the piece,
the residual stream summed by hand."""

import io
from dataclasses import replace

import pytest
import torch
from hydra import compose, initialize_config_dir

import model.attention as attention_module
import sample
import train
from conf import CONF_DIR
from conf.sample_config import load_sample_config
from conftest import tiny_config, training_overrides
from hf.gpt2 import config_to_hf
from model import GPT, GPTConfig, KVCache
from run.checkpoints import find_checkpoint, load_checkpoint
from run.load import checkpoint_model
from test_generate import reference_greedy

EOT = 96  # tiny_config's last id opens each document
TOL = dict(rtol=1e-5, atol=1e-5)


def build(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_config(**overrides)).eval()


def window(*lengths: int, seed: int = 0) -> list[torch.Tensor]:
    """Documents of these lengths, no end-of-text among their tokens; each but the first opens with it,
    as the shards write them."""
    generator = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, EOT, (n,), generator=generator) for n in lengths]
    return [docs[0], *(torch.cat([torch.tensor([EOT]), d[1:]]) for d in docs[1:])]


@pytest.mark.parametrize("attn_impl", ["sdpa", "manual"])
@pytest.mark.parametrize("position", ["rope", "learned"])
def test_document_masks_compute_every_document_of_a_window_as_if_alone(attn_impl, position):
    settings = dict(position=position, attn_impl=attn_impl, n_kv_head=2)
    masked = build(document_masks=True, eot_id=EOT, **settings)
    alone = build(**settings)  # the same weights, reading one document at a time
    docs = window(5, 7, 4)
    other_row = window(16, seed=1)[0]  # a window inside one document: plain causal attention
    with torch.no_grad():
        logits, _ = masked(torch.stack([torch.cat(docs), other_row]))
        expected = torch.cat([alone(d[None])[0][0] for d in docs])
        torch.testing.assert_close(logits[0], expected, **TOL)
        torch.testing.assert_close(logits[1], alone(other_row[None])[0][0], **TOL)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attentions_block_mask_gives_the_boolean_masks_logits(monkeypatch):
    """CUDA's path (a FlexAttention BlockMask), run on the CPU through FlexAttention's unfused
    implementation: the same logits as the boolean mask SDPA gets, with grouped heads."""
    masked = build(document_masks=True, eot_id=EOT, position="rope", n_kv_head=2)
    idx = torch.stack([torch.cat(window(6, 10)), torch.cat(window(3, 3, 10, seed=2))])
    with torch.no_grad():
        expected, _ = masked(idx)
        calls = []
        monkeypatch.setattr("model.gpt.FLEX_DEVICES", ("cpu",))
        monkeypatch.setattr(attention_module, "flex_attend", lambda *a: calls.append(1) or flex_attend(*a))
        logits, _ = masked(idx)
    assert len(calls) == 2  # each layer
    torch.testing.assert_close(logits, expected, **TOL)


flex_attend = attention_module.flex_attend


@pytest.mark.cuda
def test_on_cuda_document_masks_train_through_compiled_flex_attention():
    """The CUDA path: FlexAttention's compiled kernel (with its backward, which the CPU lacks)."""
    settings = dict(position="rope", n_head=2, n_kv_head=1)  # head_dim 16, the kernel's least
    masked = build(document_masks=True, eot_id=EOT, **settings).cuda()
    alone = build(**settings).cuda()
    docs = [d.cuda() for d in window(5, 7, 4)]
    idx = torch.cat(docs)[None]
    logits, loss = masked(idx, idx)
    loss.backward()
    assert all(p.grad is not None and p.grad.isfinite().all() for p in masked.parameters())
    with torch.no_grad():
        expected = torch.cat([alone(d[None])[0][0] for d in docs])
    # Loose enough for TF32 matmuls (another test may have turned them on); a mask that let a document see
    # another's tokens moves every later logit row by 0.02 or more (0.025 to 0.12 on the CPU).
    torch.testing.assert_close(logits[0].detach(), expected, rtol=5e-3, atol=5e-3)


def test_cached_decoding_reads_one_document_with_every_piece(make_model):
    """Generation is one document: the cache path equals the full forward of a prompt without end-of-text."""
    pieces = build(document_masks=True, eot_id=EOT, unet_skips=True, position="rope", n_layer=4)
    idx = torch.stack(window(12, seed=3) + window(12, seed=4))
    cache = KVCache(pieces.config, batch_size=2)
    with torch.no_grad():
        full, _ = pieces(idx)
        prefill, _ = pieces(idx[:, :7], kv_cache=cache)
        steps = [pieces(idx[:, t : t + 1], kv_cache=cache, last_only=True)[0] for t in range(7, 12)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, **TOL)


def test_zeroed_skip_weights_leave_the_plain_model_and_its_other_weights():
    plain, model = build(n_layer=4), build(n_layer=4, unet_skips=True)
    idx = torch.cat(window(16, seed=5))[None]
    shared = {name: w for name, w in model.state_dict().items() if name != "skip_weights"}
    torch.testing.assert_close(shared, plain.state_dict(), rtol=0, atol=0)  # no other weight's draw moved
    with torch.no_grad():
        model.skip_weights.zero_()
        torch.testing.assert_close(model(idx)[0], plain(idx)[0], rtol=0, atol=0)


def test_unet_skips_add_the_first_halfs_outputs_to_the_second_halfs_inputs_in_mirror_order():
    model = build(unet_skips=True, n_layer=5)
    with torch.no_grad():
        model.skip_weights.copy_(torch.tensor([0.7, -1.3]))
        idx = torch.cat(window(16, seed=6))[None]
        h = model.transformer.h
        x0 = h[0](model.transformer.wte(idx) + model.transformer.wpe(torch.arange(16)))
        x1 = h[1](x0)
        x2 = h[2](x1)  # the middle block: no skip
        x3 = h[3](x2 + -1.3 * x1)
        x4 = h[4](x3 + 0.7 * x0)
        torch.testing.assert_close(model(idx)[0], model.lm_head(model.transformer.ln_f(x4)), **TOL)


def test_the_pieces_settings_are_checked_where_they_enter():
    with pytest.raises(ValueError, match=r"model.eot_id \(97\) must be a token id, below vocab_size \(97\)"):
        tiny_config(eot_id=97)
    with pytest.raises(ValueError, match="model.document_masks needs model.eot_id"):
        GPT(tiny_config(document_masks=True))


def test_export_refuses_unet_skips_naming_them_and_takes_document_masks():
    with pytest.raises(ValueError, match="^model.unet_skips=True: no transformers class computes U-net skips"):
        config_to_hf(GPTConfig(n_layer=2, unet_skips=True), eos_token_id=None)
    config_to_hf(GPTConfig(n_layer=2, document_masks=True, eot_id=0), eos_token_id=None)  # masks change no weight


def run_in_process(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return train.train(compose(config_name="train", overrides=list(overrides)))


def test_a_run_with_every_piece_masks_its_corpuss_documents_and_samples_as_one_document(tmp_path):
    overrides = [
        *training_overrides(tmp_path),
        "data.document_separator=famish",
        "model.document_masks=true",
        "model.unet_skips=true",
        "max_iters=4",
        "eval_interval=4",
    ]
    run_dir = run_in_process(*overrides)
    checkpoint = load_checkpoint(find_checkpoint(run_dir, runs_root=run_dir.parent))
    tokenizer = checkpoint.tokenizer()
    assert checkpoint.model_config.eot_id == tokenizer.eot_id is not None
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        request = compose(
            config_name="sample",
            overrides=[f"checkpoint={run_dir}", "prompt=First", "temperature=0", "max_new_tokens=20"],
        )
    result = sample.sample(load_sample_config(request), out=io.StringIO())
    one_document = checkpoint_model(checkpoint, torch.device("cpu"), torch.float32)
    one_document.config = replace(one_document.config, document_masks=False)  # the reference reads no masks
    expected = tokenizer.decode(reference_greedy(one_document, tokenizer.encode("First"), 20))
    assert result["samples"][0]["text"] == expected
    with pytest.raises(ValueError, match="model.document_masks=true needs documents, and this corpus has one"):
        (tmp_path / "one").mkdir()
        run_in_process(*training_overrides(tmp_path / "one"), "model.document_masks=true")
