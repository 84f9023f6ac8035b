"""A GPU experiment's plan before any GPU runs it: for the GPU ablation, how many seeds detect
the effects it is after; for any experiment, what its runs cost in GPU-hours. A computation
from published figures and the model's own FLOPs, not a measurement.

    python bench/gpu_plan.py                                 # experiment=attention_ablation_gpt2
    python bench/gpu_plan.py --noise 0.0026 --mfu 0.3        # twice the noise, a slower GPU
    python bench/gpu_plan.py --experiment gpt2_fineweb       # one run: its cost only

Seeds: the report compares each arm with MHA by a paired t-test over seeds, two-sided at
p < 0.05, with Holm's adjustment over the arms (the strictest of m tests is at 0.05 / m).
One seed's difference has sd sqrt(2 (1 - rho)) * noise, noise being the run-to-run sd of one
run's final val loss (about 0.0013 nats at GPT-2 small) and rho the correlation of two arms
under one seed (0 here: pairing only helps). For each effect, the fewest seeds at which the
test detects it 80% of the time (ablation.stats.seeds_for: the noncentral t). Effects in bits
per byte become nats per GPT-2 token through --bytes-per-token (an assumption for English web
text; a run's metrics measure it as val_bpb against val_loss).

Cost: training FLOPs per token from the model (GPT.flops_per_token: 6 per matmul weight plus
attention's 12 * layers * width * context) times each run's tokens, at --mfu of the GPU's
dense bf16 peak (training/mfu.py's datasheet figures), plus --overhead-min per run for what
is not a training step (compile, evaluations, checkpoints, HellaSwag). Eight GPUs run the
sweep one run at a time under torchrun, each run's steps split eight ways.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # runnable from a checkout

from hydra import compose, initialize_config_dir  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from ablation.stats import LEVEL, POWER, detectable_effect, seeds_for  # noqa: E402
from conf import CONF_DIR, load_config  # noqa: E402
from data import Gpt2Tokenizer  # noqa: E402
from model import GPT  # noqa: E402
from run.init_from import initial_model  # noqa: E402
from training.mfu import GPU_PEAKS  # noqa: E402
from training.provenance import provenance  # noqa: E402

EXPERIMENT = "attention_ablation_gpt2"
GPUS = ("H100 SXM", "A100")
# The effects the issue names (published small-scale results), and the noise at GPT-2 small.
GQA_BPB_PER_HALVING = 0.003
MQA_NATS = 0.02  # the low end of 0.02-0.03 at 512-768 wide
NOISE_NATS = 0.0013


@dataclass(frozen=True)
class Arm:
    n_kv_head: int
    n_head: int
    params: int
    flops_per_token: float
    tokens: int


def arms_and_seeds(experiment: str = EXPERIMENT) -> tuple[list[Arm], list[int]]:
    """The experiment's arms (its K/V head counts), composed as train.py composes them, and its
    seeds; an experiment that sweeps nothing is one arm under one seed."""
    swept = OmegaConf.select(OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml"), "hydra.sweeper.params")
    seeds = [int(s) for s in str(swept["seed"]).split(",")] if swept else [0]
    arms = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        for kv in str(swept["model.n_kv_head"]).split(",") if swept else [None]:
            overrides = [f"experiment={experiment}", *([f"model.n_kv_head={kv}"] if kv else [])]
            config = load_config(compose("train", overrides=overrides))
            model = GPT.shapes_only(initial_model(config, Gpt2Tokenizer())[0])
            arms.append(
                Arm(
                    model.config.kv_heads,
                    model.config.n_head,
                    model.num_params(),
                    model.flops_per_token(),
                    config.tokens_per_step * config.max_iters,
                )
            )
    return arms, seeds


def seeds_table(noise: float, rho: float, bytes_per_token: float, n_head: int, family: int) -> list[dict]:
    """Each effect the ablation must resolve, in nats per token, with the seeds that detect it."""
    sd = math.sqrt(2 * (1 - rho)) * noise
    nats_per_bpb = math.log(2) * bytes_per_token
    effects = [
        ("GQA, one halving of the K/V heads (0.003 bits/byte)", GQA_BPB_PER_HALVING * nats_per_bpb),
        (
            f"GQA {n_head // 3} K/V heads vs MHA ({math.log2(3):.2f} halvings)",
            GQA_BPB_PER_HALVING * math.log2(3) * nats_per_bpb,
        ),
        ("MQA vs MHA (0.02 nats)", MQA_NATS),
    ]
    holm_level = 1 - (1 - LEVEL) / family
    return [
        {
            "effect": name,
            "nats": nats,
            "seeds": seeds_for(nats, sd),
            "seeds_holm": seeds_for(nats, sd, level=holm_level),
        }
        for name, nats in effects
    ]


def cost(arms: list[Arm], seeds: int, mfu: float, overhead_min: float) -> list[dict]:
    """Hours on one and on eight of each GPU, for every arm under every seed."""
    flops = seeds * sum(arm.flops_per_token * arm.tokens for arm in arms)
    runs = seeds * len(arms)
    rows = []
    for label, _, peaks in GPU_PEAKS:
        if label in GPUS:
            steps_h = flops / (peaks["bf16"] * mfu) / 3600
            one, eight = steps_h + runs * overhead_min / 60, steps_h / 8 + runs * overhead_min / 60
            rows.append(
                {"gpu": label, "peak_bf16": peaks["bf16"], "hours_1": one, "hours_8": eight, "gpu_hours_8": 8 * eight}
            )
    return rows


def print_seeds(arms: list[Arm], seeds: list[int], args: argparse.Namespace) -> dict:
    sd = math.sqrt(2 * (1 - args.rho)) * args.noise
    table = seeds_table(args.noise, args.rho, args.bytes_per_token, arms[0].n_head, len(arms) - 1)
    detected = detectable_effect(sd / math.sqrt(len(seeds)), len(seeds) - 1)
    print(
        f"one seed's paired difference has sd {sd:.5f} nats (noise {args.noise}, rho {args.rho}; "
        f"{args.bytes_per_token} bytes per token)\n"
    )
    print(
        f"| effect | nats/token | seeds for {POWER:.0%} power, p<0.05 | "
        f"with Holm, p<{(1 - LEVEL) / (len(arms) - 1):.3g} |"
    )
    print("|---|--:|--:|--:|")
    for row in table:
        print(f"| {row['effect']} | {row['nats']:.4f} | {row['seeds']} | {row['seeds_holm']} |")
    print(f"\n{len(seeds)} seeds detect {detected:.4f} nats or more {POWER:.0%} of the time.\n")
    return {"effects": table, "detected_nats": detected}


def print_cost(arms: list[Arm], seeds: list[int], args: argparse.Namespace) -> list[dict]:
    hours = cost(arms, len(seeds), args.mfu, args.overhead_min)
    print(
        f"| GPU | hours on 1 | hours on 8 | GPU-hours on 8 |  (an estimate: {args.mfu:.0%} MFU, "
        f"{args.overhead_min:g} min a run besides its steps)"
    )
    print("|---|--:|--:|--:|")
    for row in hours:
        print(f"| {row['gpu']} | {row['hours_1']:.1f} | {row['hours_8']:.1f} | {row['gpu_hours_8']:.1f} |")
    return hours


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default=EXPERIMENT, help="a conf/experiment preset")
    parser.add_argument("--noise", type=float, default=NOISE_NATS, help="sd of one run's final val loss, nats")
    parser.add_argument("--rho", type=float, default=0.0, help="correlation of two arms' losses under one seed")
    parser.add_argument("--bytes-per-token", type=float, default=4.5, help="UTF-8 bytes per GPT-2 token of the corpus")
    parser.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation")
    parser.add_argument("--overhead-min", type=float, default=10.0, help="minutes per run outside training steps")
    parser.add_argument("--json", type=Path, help="default: bench/results/gpu_plan_<experiment>.json")
    args = parser.parse_args(argv)
    arms, seeds = arms_and_seeds(args.experiment)
    print(
        f"experiment={args.experiment}: {len(arms)} arm(s) x {len(seeds)} seed(s), "
        f"{arms[0].tokens / 1e9:.2f}B tokens a run"
    )
    record = {"experiment": args.experiment, "arms": [vars(arm) for arm in arms], "seeds": seeds}
    if len(arms) > 1:
        record.update(print_seeds(arms, seeds, args))
    record["cost"] = print_cost(arms, seeds, args)
    record["arguments"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    record["provenance"] = provenance()
    out = args.json or ROOT / "bench" / "results" / f"gpu_plan_{args.experiment}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
