"""Saving checkpoints: lossless round trip, atomic replacement, pruning, what is never
written, leftovers of killed saves; and what a resume restores besides the weights (the
fp16 loss scale, the optimizer's state). Reading checkpoints back and naming their
damage: test_checkpoint_reading.py."""

import errno
import os
import shutil

import pytest
import torch
from safetensors import SafetensorError

from conf import Config, OptimConfig
from data.meta import file_sha256
from run import checkpoints as manager
from run.checkpoints import CheckpointError, Checkpoints, find_checkpoint, load_checkpoint, load_weights
from run.distributed import Ranks
from run.metrics import read_metrics
from run.runtime import Precision, resolve_precision, rng_state
from test_train import run_in_process
from training.optim import build_optimizer


def save(run_dir, step, model, keep_last=3, keep_state="all", is_best=False):
    config = {"model": model.config.__dict__, "data": {"name": "test"}, "tokenizer": {"name": "char"}}
    state = {
        "step": step,
        "best_val_loss": 1.0,
        "optimizer": {"lr": 0.1},
        "scaler": {},
        "rng": [{"torch": torch.get_rng_state()}],
    }
    return Checkpoints(run_dir, keep_last=keep_last, keep_state=keep_state).save(
        step, model, config, state, is_best=is_best
    )


def test_round_trip_restores_identical_weights_and_state(tmp_path, make_model):
    model = make_model(seed=1)
    path = save(tmp_path, 7, model)
    loaded = load_checkpoint(path)
    fresh = make_model(seed=2)
    load_weights(fresh, loaded.model_state)
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
    assert fresh.lm_head.weight is fresh.transformer.wte.weight  # still tied after loading
    assert loaded.model_config == model.config
    assert loaded.training_state()["step"] == 7
    assert "lm_head.weight" not in loaded.model_state  # the tied copy is stored once
    assert loaded.run_dir == tmp_path


def test_latest_moves_and_old_checkpoints_are_pruned_but_best_is_kept(tmp_path, make_model):
    model = make_model()
    save(tmp_path, 1, model, keep_last=2, is_best=True)
    for step in (2, 3, 4):
        save(tmp_path, step, model, keep_last=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == [
        "step_000001",
        "step_000003",
        "step_000004",
    ]
    assert find_checkpoint(tmp_path, runs_root=tmp_path) == (root / "step_000004").resolve()
    assert (root / "best").resolve().name == "step_000001"


def test_crash_while_saving_leaves_previous_checkpoint_in_place(tmp_path, make_model, monkeypatch):
    model = make_model()
    good = save(tmp_path, 1, model)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(manager.torch, "save", crash)
    with pytest.raises(
        CheckpointError,
        match=f"could not write .*disk full.* checkpoint .*step_000002; the last good "
        f"checkpoint {good.resolve()} is intact",
    ):
        save(tmp_path, 2, model)
    assert find_checkpoint(tmp_path, runs_root=tmp_path) == good.resolve()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "latest",
        "step_000001",
    ]  # no temporary left
    load_weights(make_model(seed=3), load_checkpoint(good).model_state)


@pytest.mark.parametrize(
    "writer, failure",
    [
        ("save_file", lambda: OSError(errno.ENOSPC, "No space left on device")),
        ("save_file", lambda: SafetensorError("Error while serializing: IoError(Os { code: 28 })")),
        ("torch_save", lambda: RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")),
    ],
)
def test_a_full_disk_is_one_message_and_removes_the_temporary_files(tmp_path, make_model, monkeypatch, writer, failure):
    """Each library reports a full disk its own way; torch's message names no errno, so
    the free space decides."""
    model = make_model()
    good = save(tmp_path, 1, model)

    def full(*args, **kwargs):
        raise failure()

    if writer == "torch_save":
        monkeypatch.setattr(manager.torch, "save", full)
    else:
        monkeypatch.setattr(manager, "save_file", full)
    monkeypatch.setattr(manager.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(
        CheckpointError,
        match=f"^no space left on device writing checkpoint .*step_000002; the last "
        f"good checkpoint {good.resolve()} is intact$",
    ):
        save(tmp_path, 2, model)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]


def test_saving_the_same_step_again_replaces_it_and_no_link_ever_dangles(tmp_path, make_model, monkeypatch):
    save(tmp_path, 5, make_model(seed=1), is_best=True)
    root = tmp_path / "checkpoints"
    seen = []

    def links_lead_to_complete_checkpoints(*args):
        for name in ("latest", "best"):
            assert os.readlink(root / name) == os.path.basename(os.readlink(root / name))  # relative
            assert (root / name / "model.safetensors").is_file() and (root / name / "state.pt").is_file(), name
        seen.append(args)

    for module, name in [
        (manager.os, "rename"),
        (manager.os, "replace"),
        (manager.shutil, "rmtree"),
        (manager.shutil, "copytree"),
    ]:
        original = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _o=original, **k: (links_lead_to_complete_checkpoints(*a), _o(*a, **k))[1]
        )
    original_rename = manager.Path.rename
    monkeypatch.setattr(
        manager.Path,
        "rename",
        lambda self, target: (links_lead_to_complete_checkpoints(self), original_rename(self, target))[1],
    )

    second = make_model(seed=2)
    path = save(tmp_path, 5, second)  # not the best any more, but best still leads to step 5
    monkeypatch.undo()
    assert len(seen) >= 4  # the checks ran at every move
    torch.testing.assert_close(
        load_checkpoint(path).model_state["transformer.wte.weight"], second.transformer.wte.weight
    )
    for name in ("latest", "best"):
        assert os.readlink(root / name) == "step_000005"
    assert [p.name for p in root.iterdir() if p.name.startswith(".")] == []


def test_a_re_save_that_fails_midway_leaves_every_link_leading_to_a_complete_checkpoint(
    tmp_path, make_model, monkeypatch
):
    save(tmp_path, 5, make_model(seed=1), is_best=True)
    root = tmp_path / "checkpoints"

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(manager.shutil, "copytree", disk_full)  # after the links moved to the new copy
    with pytest.raises(CheckpointError, match="no space left on device writing checkpoint"):
        save(tmp_path, 5, make_model(seed=2))
    monkeypatch.undo()
    for name in ("latest", "best"):
        load_checkpoint(find_checkpoint(root / name, runs_root=tmp_path)).training_state()


def test_pruning_keeps_the_newest_by_step_number_past_step_999999(tmp_path, make_model):
    model = make_model()
    for step in (999_998, 999_999, 1_000_000, 1_000_001):
        save(tmp_path, step, model, keep_last=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_1000000", "step_1000001"]
    assert os.readlink(root / "latest") == "step_1000001"


def test_leftovers_of_an_interrupted_save_are_cleaned_up(tmp_path, make_model):
    save(tmp_path, 1, make_model())
    leftover = tmp_path / "checkpoints" / ".tmp_step_000002_99999"
    leftover.mkdir()
    save(tmp_path, 2, make_model())
    assert not leftover.exists()


def test_non_finite_weights_are_never_written(tmp_path, make_model):
    good = save(tmp_path, 1, make_model())
    broken = make_model()
    with torch.no_grad():
        broken.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"non-finite weights in transformer.h.0.mlp.c_fc.weight.*untouched"):
        save(tmp_path, 2, broken)
    assert find_checkpoint(tmp_path, runs_root=tmp_path) == good.resolve()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "step_000001"]


def test_saving_a_wrapped_model_stores_plain_names(tmp_path, make_model):
    class Wrapper(torch.nn.Module):  # stands in for DDP: the model lives at .module
        def __init__(self, module):
            super().__init__()
            self.module = module

    wrapped = Wrapper(make_model())
    wrapped.config = wrapped.module.config
    path = save(tmp_path, 1, wrapped)
    assert all(not k.startswith("module.") for k in load_checkpoint(path).model_state)


def test_keep_state_latest_leaves_weights_only_in_older_and_best_checkpoints(tmp_path, make_model):
    model = make_model()
    save(tmp_path, 1, model, is_best=True, keep_state="latest")
    for step in (2, 3):
        save(tmp_path, step, model, keep_last=2, keep_state="latest")
    root = tmp_path / "checkpoints"
    with_state = sorted(p.name for p in root.glob("step_*") if (p / "state.pt").exists())
    assert with_state == ["step_000003"]
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000001", "step_000002", "step_000003"]
    load_weights(make_model(seed=4), load_checkpoint(root / "best").model_state)  # best still loads
    with pytest.raises(CheckpointError, match="holds weights only and cannot be resumed"):
        load_checkpoint(root / "step_000002").training_state()
    for older in ("step_000001", "step_000002"):  # what `sha256sum -c SHA256SUMS` reads: every listed file, intact
        listed = [line.split("  ", 1) for line in (root / older / "SHA256SUMS").read_text().splitlines()]
        assert "state.pt" not in {name for _, name in listed} and "model.safetensors" in {name for _, name in listed}
        assert all(file_sha256(root / older / name) == digest for digest, name in listed)


def test_leftovers_of_killed_saves_are_removed_but_never_one_a_link_leads_to(tmp_path, make_model):
    save(tmp_path, 1, make_model())
    root = tmp_path / "checkpoints"
    killed = [root / ".tmp_step_000002_999", root / ".stale_step_000001_999"]
    for leftover in killed:
        shutil.copytree(root / "step_000001", leftover)
    linked = root / ".tmp_step_000001_998"  # a re-save killed while latest led to its new copy
    shutil.copytree(root / "step_000001", linked)
    (root / "latest").unlink()
    (root / "latest").symlink_to(linked.name)
    assert sorted(Checkpoints(tmp_path).remove_interrupted_saves()) == sorted(killed)
    assert sorted(p.name for p in root.iterdir()) == [linked.name, "latest", "step_000001"]


# --- what a resume restores besides the weights: the fp16 loss scale ---------------------------------

CPU = torch.device("cpu")


def moved_loss_scale() -> torch.amp.GradScaler:
    """train.py's fp16 scaler after one overflow (the scale halved to 32768) and two clean
    steps (its growth tracker at 2): both differ from a fresh scaler's."""
    scaler = resolve_precision("fp16", CPU).grad_scaler()
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    for factor in (1e35, 1.0, 1.0):  # 1e35 * 65536 overflows fp32's range
        scaler.scale((weight * factor).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    return scaler


def test_restore_brings_back_the_fp16_loss_scale(tmp_path, make_model):
    model = make_model()
    optimizer = build_optimizer(model, Config().optim, "cpu")
    scaler = moved_loss_scale()
    assert (scaler.get_scale(), scaler.state_dict()["_growth_tracker"]) == (32768.0, 2)
    config = {"model": model.config.__dict__, "data": {"name": "test"}, "tokenizer": {"name": "char"}}
    state = {
        "step": 5,
        "best_val_loss": 2.0,
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": [rng_state(CPU)],
    }  # as train.py saves it
    checkpoints = Checkpoints(tmp_path)
    path = checkpoints.save(5, model, config, state)
    fresh = resolve_precision("fp16", CPU).grad_scaler()
    assert fresh.get_scale() == 65536.0
    twin = make_model(seed=1)
    step, _, _ = checkpoints.restore(
        load_checkpoint(path), twin, build_optimizer(twin, Config().optim, "cpu"), fresh, Config(), Ranks(), CPU
    )
    assert step == 5 and fresh.get_scale() == 32768.0
    assert fresh.state_dict() == scaler.state_dict()


@pytest.mark.parametrize("saved, resumed", [("muon", "adamw"), ("adamw", "muon")])
def test_resuming_under_another_optimizer_is_refused_in_one_line(tmp_path, make_model, saved, resumed):
    model = make_model()
    state = {
        "step": 5,
        "best_val_loss": 2.0,
        "rng": [rng_state(CPU)],
        "scaler": {},
        "optimizer": build_optimizer(model, OptimConfig(name=saved), "cpu").state_dict(),
    }
    config = {"model": model.config.__dict__, "data": {"name": "test"}, "tokenizer": {"name": "char"}}
    checkpoints = Checkpoints(tmp_path)
    path = checkpoints.save(5, model, config, state)
    run = Config(optim=OptimConfig(name=resumed))
    with pytest.raises(
        CheckpointError,
        match=rf"^checkpoint {path} holds another optimizer's state than "
        rf"optim.name={resumed}'s: resume with the optim.name the run was started with$",
    ):
        checkpoints.restore(
            load_checkpoint(path),
            model,
            build_optimizer(model, run.optim, "cpu"),
            resolve_precision("fp32", CPU).grad_scaler(),
            run,
            Ranks(),
            CPU,
        )


@pytest.mark.cuda
def test_an_fp16_run_resumed_where_its_loss_scale_had_moved_equals_the_uninterrupted_run(train_overrides, monkeypatch):
    """A scaler that grows after every clean step (growth_interval=1, in both runs) reaches
    fp16's overflow within a few steps and backs off, so the scale saved at step 6 is not
    a fresh scaler's, and which steps overflow after it depends on restoring it."""
    monkeypatch.setattr(
        Precision,
        "grad_scaler",
        lambda self: torch.amp.GradScaler(self.device_type, enabled=self.uses_grad_scaler, growth_interval=1),
    )
    overrides = [o for o in train_overrides if o != "device=cpu"] + [
        "device=cuda",
        "precision=fp16",
        "max_iters=12",
        "eval_interval=6",
    ]
    run_dir = run_in_process(*overrides)
    straight = [(r["step"], r["skipped"], r["loss"]) for r in read_metrics(run_dir) if r["kind"] == "train"]
    straight_weights = load_checkpoint(run_dir / "checkpoints" / "step_000012").model_state
    middle = load_checkpoint(run_dir / "checkpoints" / "step_000006")
    assert middle.training_state()["scaler"]["scale"] != 65536.0  # it moved
    assert sum(skipped for _, skipped, _ in straight) > 0  # overflows happened

    run_in_process(*overrides, f"resume={middle.path}")  # trains steps 7-12 again, in the same directory
    resumed = [(r["step"], r["skipped"], r["loss"]) for r in read_metrics(run_dir) if r["kind"] == "train"]
    assert [(s, k) for s, k, _ in resumed] == [(s, k) for s, k, _ in straight]  # the same steps overflowed
    assert [loss for *_, loss in resumed] == pytest.approx([loss for *_, loss in straight], rel=1e-4)
    for name, weight in load_checkpoint(run_dir / "checkpoints" / "step_000012").model_state.items():
        torch.testing.assert_close(weight, straight_weights[name], rtol=1e-3, atol=1e-4, msg=name)


def test_a_run_with_keep_state_latest_keeps_state_in_its_newest_checkpoint_only(train_overrides):
    run_dir = run_in_process(*train_overrides, "max_iters=20", "keep_state=latest", "keep_last=5")
    root = run_dir / "checkpoints"
    steps = sorted(p.name for p in root.glob("step_*"))
    assert steps == ["step_000010", "step_000020"]
    assert [name for name in steps if (root / name / "state.pt").exists()] == ["step_000020"]
