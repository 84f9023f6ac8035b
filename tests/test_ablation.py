"""The attention ablation: its sweep composes, and report.py builds from real runs."""

import pytest
from hydra import compose, initialize_config_dir

import report
import train
from conf import CONF_DIR, load_config

from conftest import training_overrides


def compose_experiment(name, *overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(config_name="train", overrides=[f"experiment={name}", *overrides], return_hydra_config=hydra)


@pytest.mark.parametrize("experiment, n_head", [("attention_ablation", 4), ("attention_ablation_gpt2", 12)])
def test_every_variant_of_the_sweep_composes(experiment, n_head):
    sweep = compose_experiment(experiment, hydra=True).hydra.sweeper.params["model.n_kv_head"]
    kv_heads = [int(k) for k in sweep.split(",")]
    assert kv_heads[0] == n_head and kv_heads[-1] == 1 and len(kv_heads) == 3  # MHA, GQA, MQA
    kinds = [load_config(compose_experiment(experiment, f"model.n_kv_head={k}")).model.attention_kind for k in kv_heads]
    assert kinds == ["MHA", "GQA", "MQA"]
    for k in kv_heads:  # everything but the attention is identical
        config = load_config(compose_experiment(experiment, f"model.n_kv_head={k}", "model.match_mha_params=true"))
        assert config.model.n_head == n_head and config.max_iters == load_config(compose_experiment(experiment)).max_iters


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """Three real (tiny) runs, MHA, GQA and MQA, as a sweep would leave them."""
    directory = tmp_path_factory.mktemp("sweep")
    overrides = training_overrides(directory)
    for kv_heads in (4, 2, 1):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(config_name="train", overrides=[
                *overrides, "max_iters=6", "eval_interval=3", f"model.n_kv_head={kv_heads}",
                f"out_dir={directory / 'sweep' / f'kv{kv_heads}'}",
            ])
        train.train(cfg)
    return directory / "sweep"


def test_report_holds_every_variant_with_numbers_from_its_runs(sweep_dir, tmp_path):
    path = report.write_report(sweep_dir, tmp_path, new_tokens=4, prompt="First Citizen: hear me")
    text = path.read_text()
    variants = report.find_variants(sweep_dir)
    assert [v.label for v in variants] == ["MHA (4 kv heads)", "GQA (2 kv heads)", "MQA (1 kv heads)"]
    for variant in variants:
        final = variant.records("eval")[-1]
        row = next(line for line in text.splitlines() if line.startswith(f"| {variant.label} |"))
        assert f"| {final['val_loss']:.4f} |" in row
        assert f"| {variant.model().num_params():,} |" in row
    for image in ("val_loss.png", "attention.png"):
        assert (tmp_path / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({image})" in text


def test_kv_cache_shrinks_with_kv_heads(sweep_dir):
    rows = [report.summarize(v, new_tokens=2) for v in report.find_variants(sweep_dir)]
    assert [r["kv_cache_mb"] for r in rows] == pytest.approx([rows[0]["kv_cache_mb"] / d for d in (1, 2, 4)])


def test_report_on_a_directory_without_runs_says_so(tmp_path, capsys):
    with pytest.raises(SystemExit, match="no run directories with checkpoints"):
        report.main([str(tmp_path)])
