"""Reading checkpoints back: finding the one meant (the newest run at any depth, a
dangling `latest`), loading weights saved from a compiled or DDP model or into another
shape, and naming each kind of damage (a flipped bit, a damaged digest listing, a corrupt
or wrongly built training state, missing files) in one message, not a traceback."""

import os
import shutil

import pytest
import torch

from run.checkpoints import CheckpointError, find_checkpoint, load_checkpoint, load_weights
from test_checkpoint import save


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "module._orig_mod."])
def test_weights_from_compiled_or_ddp_models_load(make_model, prefix):
    source = make_model(seed=1)
    state = {prefix + k: v for k, v in source.state_dict().items()}
    target = make_model(seed=2)
    load_weights(target, state)
    torch.testing.assert_close(target.transformer.wpe.weight, source.transformer.wpe.weight)


def test_different_model_shape_is_explained(tmp_path, make_model):
    path = save(tmp_path, 1, make_model(n_kv_head=1))
    with pytest.raises(
        CheckpointError,
        match=r"different model shape.*c_attn.weight is \(48, 32\) in the checkpoint, \(96, 32\) by the model",
    ):
        load_weights(make_model(n_kv_head=4), load_checkpoint(path).model_state)


def flip_one_byte(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["model.safetensors", "config.yaml", "state.pt"])
def test_a_flipped_bit_in_any_file_of_a_checkpoint_is_caught_by_its_digest(tmp_path, make_model, name):
    """Neither safetensors nor torch.load notices a flipped bit in the data (a weight
    changes in its 7th digit; a zip CRC goes unchecked): the recorded sha256 does."""
    path = save(tmp_path, 1, make_model())
    flip_one_byte(path / name, -20 if name != "config.yaml" else 3)
    with pytest.raises(CheckpointError, match=f"{path / name} does not match the sha256 recorded when it was saved"):
        checkpoint = load_checkpoint(path)
        checkpoint.training_state()


def test_a_checkpoint_saved_before_digests_is_still_read_and_damage_is_named(tmp_path, make_model):
    path = save(tmp_path, 1, make_model())
    (path / "SHA256SUMS").unlink()
    assert load_checkpoint(path).training_state()["step"] == 1
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"corrupt weights file {weights}"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda listing: listing.write_bytes(listing.read_bytes()[:30]), "'[0-9a-f]{30}' is not '<sha256>  <file>'"),
        (lambda listing: listing.write_bytes(b"\xff\xfe" + listing.read_bytes()), "'utf-8' codec can't decode"),
        (lambda listing: listing.write_text(""), "model.safetensors is not listed"),
        (lambda listing: (listing.unlink(), listing.mkdir()), "Is a directory"),
    ],
)
def test_a_damaged_digest_listing_is_named_not_skipped(tmp_path, make_model, damage, why):
    path = save(tmp_path, 1, make_model())
    damage(path / "SHA256SUMS")
    with pytest.raises(
        CheckpointError,
        match=f"^{path / 'SHA256SUMS'} is damaged \\({why}.*\\): the checkpoint's files "
        "cannot be checked; use another checkpoint",
    ):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "corrupt training state .*: [A-Za-z]"),  # an empty file still says what is wrong
        (b"not a torch archive", "corrupt training state"),
    ],
)
def test_corrupt_training_state_is_named(tmp_path, make_model, content, problem):
    path = save(tmp_path, 1, make_model())
    (path / "SHA256SUMS").unlink()  # damage the digests would catch first
    (path / "state.pt").write_bytes(content)
    with pytest.raises(CheckpointError, match=problem):
        load_checkpoint(path).training_state()


@pytest.mark.parametrize(
    "state, problem",
    [
        ([1, 2], "holds a list, not a dict"),
        ({"step": 1, "optimizer": {}, "scaler": {}, "rng": []}, "'best_val_loss' missing"),
        ({"step": "7", "best_val_loss": 1.0, "optimizer": {}, "scaler": {}, "rng": []}, "'step' is a str, not int"),
        ({"step": 7, "best_val_loss": 1.0, "scaler": {}, "rng": []}, "'optimizer' missing"),
    ],
)
def test_a_state_of_the_wrong_structure_is_named_not_a_traceback(tmp_path, make_model, state, problem):
    path = save(tmp_path, 1, make_model())
    torch.save(state, path / "state.pt")
    (path / "SHA256SUMS").unlink()
    with pytest.raises(CheckpointError, match=f"state.pt is not a training state of train.py \\(.*{problem}"):
        load_checkpoint(path).training_state()


def test_incomplete_checkpoint_lists_missing_files(tmp_path, make_model):
    path = save(tmp_path, 1, make_model())
    os.remove(path / "config.yaml")
    with pytest.raises(CheckpointError, match="incomplete checkpoint .*missing config.yaml"):
        load_checkpoint(path)


def test_missing_checkpoint_says_where_it_looked(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint found under .*python train.py"):
        find_checkpoint(None, runs_root=tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        find_checkpoint(tmp_path / "nowhere", runs_root=tmp_path)
    with pytest.raises(CheckpointError, match="expected model.safetensors"):
        find_checkpoint(tmp_path, runs_root=tmp_path)


def test_the_newest_run_is_found_at_any_depth_such_as_inside_a_sweep(tmp_path, make_model):
    save(tmp_path / "single_run", 1, make_model())
    newest = save(tmp_path / "attention_ablation_2026-12-01" / "kv1", 1, make_model())
    assert find_checkpoint(None, runs_root=tmp_path) == newest.resolve()
    with pytest.raises(CheckpointError, match="pass resume=PATH"):
        find_checkpoint(None, runs_root=tmp_path / "empty", setting="resume")


def test_run_saved_most_recently_is_found_without_a_path(tmp_path, make_model):
    save(tmp_path / "run_a", 1, make_model())
    save(tmp_path / "run_b", 1, make_model())
    assert find_checkpoint(None, runs_root=tmp_path).parent.parent.name == "run_b"
    newest = save(tmp_path / "run_a", 2, make_model())
    assert find_checkpoint(None, runs_root=tmp_path) == newest.resolve()


def test_a_dangling_latest_falls_back_to_the_newest_complete_checkpoint_and_says_so(tmp_path, make_model, capsys):
    for step in (1, 2, 3):
        save(tmp_path, step, make_model())
    root = tmp_path / "checkpoints"
    shutil.rmtree(root / "step_000003")
    for target in (tmp_path, None):  # the run directory, or the newest run under runs_root
        assert find_checkpoint(target, runs_root=tmp_path) == (root / "step_000002").resolve()
        assert (
            f"warning: {root / 'latest'} leads to step_000003, which is gone or incomplete; using the newest "
            f"complete checkpoint left, {root / 'step_000002'}" in capsys.readouterr().err
        )
    (root / "latest").unlink()  # the link itself lost: the run directory still leads to its newest step
    assert find_checkpoint(tmp_path, runs_root=tmp_path) == (root / "step_000002").resolve()
    assert (
        f"warning: {root} has no `latest` link; using its newest complete checkpoint, {root / 'step_000002'}"
        in capsys.readouterr().err
    )
    (root / "latest").symlink_to("step_000003")
    for step in (1, 2):
        shutil.rmtree(root / f"step_{step:06d}")
    with pytest.raises(CheckpointError, match="leads to step_000003, which is gone, and no other checkpoint is left"):
        find_checkpoint(tmp_path, runs_root=tmp_path)
