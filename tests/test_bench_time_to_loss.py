"""bench/time_to_loss.py: its arms, how it reads training seconds and curves from metrics.jsonl,
where a curve reaches the target, and the table, on hand-made records (no training)."""

from dataclasses import asdict

import pytest
from hydra import compose, initialize_config_dir

from bench.time_to_loss import CANDIDATES, PIECES, SPEEDRUN_PIECES, _train_seconds, arms, configured_steps, read_run
from bench.time_to_loss_table import Run, markdown, reach, summarise
from conf import CONF_DIR, load_config


def compose_config(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return load_config(compose(config_name="train", overrides=list(overrides)))


def changed_settings(config, reference) -> dict[str, object]:
    return {
        f"{section}.{name}": value
        for section in ("model", "optim")
        for name, value in asdict(getattr(config, section)).items()
        if value != getattr(getattr(reference, section), name)
    }


def test_each_piece_undoes_one_setting_of_the_modern_recipe_back_to_gpt2s():
    modern, gpt2 = compose_config("recipe=modern"), compose_config("recipe=gpt2")
    for piece, undo in PIECES.items():
        if piece != "bpe":
            changed = changed_settings(compose_config("recipe=modern", *undo), modern)
            assert len(changed) == 1, (piece, changed)  # a piece the recipe does not set would change nothing
            [(key, value)] = changed.items()
            section, name = key.split(".")
            assert value == getattr(getattr(gpt2, section), name), piece


def test_each_candidate_adds_one_setting_the_modern_recipe_leaves_at_gpt2s():
    modern, gpt2 = compose_config("recipe=modern"), compose_config("recipe=gpt2")
    for piece, add in CANDIDATES.items():
        changed = changed_settings(compose_config("recipe=modern", *add), modern)
        assert len(changed) == 1, (piece, changed)  # one the recipe already has would change nothing
        [key] = changed
        section, name = key.split(".")
        assert getattr(getattr(modern, section), name) == getattr(getattr(gpt2, section), name), piece


def test_leave_one_out_has_an_arm_per_piece_and_a_character_corpus_keeps_its_tokenizer():
    table = arms("stdlib", leave_one_out=True, vocab_size=4096)
    assert set(table) == {"gpt2", "modern", *(f"modern - {p}" for p in PIECES), *(f"modern + {p}" for p in CANDIDATES)}
    assert table["modern - rope"] == [*table["modern"], "model.position=learned"]
    assert "data.vocab_size=4096" in table["modern"] and "data.tokenizer=gpt2" in table["gpt2"]
    char = arms("shakespeare_char", leave_one_out=True, vocab_size=4096)
    assert "modern - bpe" not in char and not any("tokenizer" in o for o in char["modern"])


def test_the_modern_arm_names_its_block_and_a_block_arm_changes_only_the_block():
    table = arms("stdlib", leave_one_out=False, vocab_size=4096, blocks=True)
    assert set(table) == {"gpt2", "modern", "modern (nanochat block)"}
    pinned, nanochat = (compose_config(*table[arm]) for arm in ("modern", "modern (nanochat block)"))
    assert pinned.model == compose_config("recipe=modern", "model/block=modern").model
    changed = changed_settings(nanochat, pinned)
    assert changed == {"model.norm": "rmsnorm", "model.norm_weight": False, "model.embed_norm": True}  # mini: no biases
    assert pinned.data == nanochat.data and pinned.optim == nanochat.optim


def records(windows, evals):
    """metrics.jsonl: train windows (tokens so far, tok/s) and evaluations (tokens, val bpb) in order."""
    out = [{"kind": "eval", "step": 0, "tokens": 0, "val_bpb": 4.0}]
    for (tokens, rate), (eval_tokens, bpb) in zip(windows, evals):
        out.append({"kind": "train", "step": tokens // 100, "tokens": tokens, "tok_per_s": rate})
        out.append({"kind": "eval", "step": eval_tokens // 100, "tokens": eval_tokens, "val_bpb": bpb})
    return out


def test_training_seconds_add_each_windows_tokens_over_its_rate_and_skip_evaluation():
    recs = records([(1000, 100.0), (3000, 400.0)], [(1000, 3.0), (3000, 2.0)])
    assert _train_seconds(recs) == [0.0, 10.0, 10.0, 15.0, 15.0]
    with pytest.raises(SystemExit, match="modern seed 1 stopped at step 10 of 30"):  # stopped by a signal
        read_run("modern", 1, 30, recs[:-2])
    run = read_run("modern", 1, 30, recs)
    assert run.curve == [(0.0, 0, 4.0), (10.0, 1000, 3.0), (15.0, 3000, 2.0)]
    assert (run.train_seconds, run.tokens, run.final_bpb) == (15.0, 3000, 2.0)


def test_reach_interpolates_between_evaluations_and_says_never():
    run = Run("modern", 1, 30, curve=[(0.0, 0, 4.0), (10.0, 1000, 3.0), (20.0, 3000, 2.0)])
    assert reach(run, 2.5) == pytest.approx((15.0, 2000.0))
    assert reach(run, 3.0) == pytest.approx((10.0, 1000.0))
    assert reach(run, 1.9) is None
    assert reach(run, 4.5) == (0.0, 0)  # below the target before training


def test_the_table_targets_gpt2s_mean_final_loss_and_pairs_arms_with_modern_by_seed():
    def run(arm, seed, final):
        return Run(
            arm, seed, 30, train_seconds=20.0, tokens=3000, final_bpb=final, curve=[(0.0, 0, 4.0), (20.0, 3000, final)]
        )

    runs = [run("gpt2", 1, 3.0), run("modern", 1, 2.0), run("gpt2", 2, 3.2), run("modern", 2, 2.4)]
    rows = {r["arm"]: r for r in summarise(runs)}
    assert rows["gpt2"]["target_bpb"] == pytest.approx(3.1)
    assert rows["modern"]["reached"] == "2/2" and rows["gpt2"]["reached"] == "1/2"
    assert rows["gpt2"]["vs_baseline"]["difference"]["mean"] == pytest.approx(0.9)  # positive: modern is lower
    # modern reaches 3.1 at 4.0 - 3.1 = 0.9 of the way down to 2.0, and 0.9/1.6 of the way to 2.4
    assert rows["modern"]["seconds_to_target"]["mean"] == pytest.approx(20 * (0.9 / 2.0 + 0.9 / 1.6) / 2)
    assert "| modern | 30 | 0 + 20 |" in markdown(list(rows.values()))
    without_target = summarise([r for r in runs if r.arm == "modern"])
    assert without_target[0]["reached"] is None and "| modern |" in markdown(without_target)


def test_a_results_file_redraws_its_table_and_plot_without_training(tmp_path, monkeypatch, capsys):
    import json

    from bench import time_to_loss

    runs = [
        Run(arm, seed, 30, 20.0, 3000, final, [(0.0, 0, 4.0), (20.0, 3000, final)])
        for seed in (1, 2)
        for arm, final in (("gpt2", 3.0 + seed / 10), ("modern", 2.0 + seed / 10))
    ]
    results = tmp_path / "results.json"
    results.write_text(
        json.dumps({"corpus": "stdlib", "budget_s": 20.0, "seeds": [1, 2], "runs": [asdict(r) for r in runs]})
    )
    monkeypatch.setattr(time_to_loss, "measure", lambda *a: pytest.fail("trained"))
    monkeypatch.setattr(
        "sys.argv", ["time_to_loss.py", "--from-json", str(results), "--plot", str(tmp_path / "curves.png")]
    )
    time_to_loss.main()
    assert markdown(summarise(runs)) in capsys.readouterr().out
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_speedrun_pins_today_and_each_piece_adds_its_own_settings_only():
    table = arms("stdlib", leave_one_out=False, vocab_size=4096, speedrun=True)
    assert set(table) == {"today", "default", *(f"today + {p}" for p in SPEEDRUN_PIECES)}
    today = compose_config(*table["today"])
    assert (today.max_iters, today.precision, today.compile, today.optim.learning_rate) == (600, "fp32", False, 2e-3)
    assert (today.optim.warmup_iters, today.optim.cooldown_frac, today.batch_size) == (100, None, 8)
    for piece, add in SPEEDRUN_PIECES.items():
        with_piece = compose_config(*table[f"today + {piece}"])
        changed = {k for k in ("precision", "compile", "max_iters") if getattr(with_piece, k) != getattr(today, k)}
        changed |= set(changed_settings(with_piece, today))
        assert changed == {o.split("=")[0] for o in add}, piece  # each named setting changes, nothing else
    assert configured_steps({"today": table["today"], "short": [*table["today"], "max_iters=7"]}) == {
        "today": 600,
        "short": 7,
    }


def test_the_speedrun_counts_start_up_and_shares_today_s_whole_run_by_seed():
    def run(arm, seed, startup, seconds, final):
        return Run(arm, seed, 10, seconds, 1000, final, [(0.0, 0, 4.0), (seconds, 1000, final)], startup)

    runs = [run("today", 1, 5.0, 95.0, 2.0), run("fast", 1, 10.0, 20.0, 1.0), run("today", 2, 5.0, 45.0, 2.0)]
    rows = {r["arm"]: r for r in summarise(runs, target_arm="today", baseline_arm="today")}
    # fast reaches 2.0 halfway down from 4.0 to 1.0... at 2/3 of its 20 s of training, after its 10 s start-up
    assert reach(runs[1], 2.0) == pytest.approx((10.0 + 20.0 * 2 / 3, 2000 / 3))
    assert rows["fast"]["share_of_target_arm"]["mean"] == pytest.approx((10.0 + 20.0 * 2 / 3) / 100.0)
    assert rows["today"]["share_of_target_arm"]["mean"] == pytest.approx(1.0)  # each seed against its own
    assert rows["fast"]["vs_baseline"]["difference"]["mean"] == pytest.approx(-1.0)  # arm - today: it ends lower
    assert "| fast | 10 | 10 + 20 |" in markdown(list(rows.values()))
    recs = records([(1000, 100.0)], [(1000, 3.0)])
    assert read_run("today", 1, 10, recs, startup_seconds=4.0).startup_seconds == 4.0


def test_arms_take_turns_going_first_seed_by_seed(monkeypatch, tmp_path):
    import argparse

    from bench import time_to_loss

    order = []

    def fake_train(overrides, out_dir, seed, max_iters, eval_interval, eval_iters):
        order.append((seed, overrides[0]))
        return [{"kind": "eval", "step": max_iters, "tokens": 1, "val_bpb": 2.0, "tok_per_s": 1.0}], 0.0

    monkeypatch.setattr(time_to_loss, "train", fake_train)
    monkeypatch.setattr(time_to_loss, "chosen_arms", lambda args: {"a": ["a=1"], "b": ["b=1"]})
    monkeypatch.setattr(time_to_loss, "configured_steps", lambda table: dict.fromkeys(table, 10))
    args = argparse.Namespace(speedrun=True, seeds=[1, 2, 3], evaluations=2, eval_iters=1)
    time_to_loss.measure(args, tmp_path)
    assert order == [(1, "a=1"), (1, "b=1"), (2, "b=1"), (2, "a=1"), (3, "a=1"), (3, "b=1")]
