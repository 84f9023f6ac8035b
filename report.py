"""Compare the runs of an attention ablation: report.md plus PNG plots.

    python train.py -m experiment=attention_ablation
    python report.py runs/attention_ablation_<date>_<time>            # writes report.md there

Every number comes from the runs' own files or is measured now (decode speed). Runs are grouped
into arms by model shape (the block included) and `arm`; per shape, every arm is compared with
the baseline (MHA from scratch unless --baseline names another), paired by seed when both ran
the same seeds. Runs that stopped before their comparison point, or have no checkpoint, are
named and left out; runs that differ in more than their arm are refused (ablation/fairness.py).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from system import quiet_interrupt_while_starting

if __name__ == "__main__":  # before the imports below: torch alone takes seconds
    quiet_interrupt_while_starting()

import torch

from ablation.attention_plot import AttentionLayout, attention_maps, plot_attention, token_labels
from ablation.commands import add_seeds_commands
from ablation.compare import Result, Uptraining, baseline_of, ladder_gaps, one_per_layout, results, uptraining
from ablation.decode import gpt2_sized, kv_cache_bytes, kv_cache_bytes_per_token, measure_layout
from ablation.downstream import downstream_section
from ablation.fairness import changes, check_same_data
from ablation.plots import plot_curves, plot_frontier, plot_ladder, plot_uptraining
from ablation.runs import GPT2_BLOCK, Arm, group_arms, layout_name, read_sweep, shape_name, shape_order, size_name
from ablation.stats import LEVEL, MAX_SEEDS, POWER, Estimate, detectable_effect, p_value, seeds_needed
from model import GPT, to_decode_layout
from system import exits
from training.provenance import provenance

DECODE_BATCHES = (1, 8)
DECODE_REPEATS = 5  # timed passes per figure, the fastest kept: a busy moment does not decide it
DEFAULT_PROMPT = "def __init__(self, name):"
DEFAULT_EFFECT = 0.01  # nats: the difference the power section counts the seeds for


def write_report(
    sweep_dir: Path,
    out_dir: Path,
    *,
    prompt: str = DEFAULT_PROMPT,
    baseline: str | None = None,
    frontier_preset=None,
    decode_steps: int = 16,
    effect: float = DEFAULT_EFFECT,
) -> Path:
    """frontier_preset maps a trained layout to the config whose random-weight decode speed the
    frontier also shows (gpt2_sized for the CLI; None: not shown)."""
    sweep = read_sweep(sweep_dir)
    check_same_data(sweep.runs)
    arms = group_arms(sweep.runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shapes = sorted({a.shape for a in arms}, key=shape_order)
    sections, per_shape = [], []
    for shape in shapes:
        members = [a for a in arms if a.shape == shape]
        base = baseline_of(members, baseline)
        rows = results(members, base)
        per_shape.append((rows[0].arm, rows))
        image = _curves_image(shape) if len(shapes) > 1 else "val_loss.png"
        plot_curves(members, base, out_dir / image, f"Validation loss, {shape_name(shape)}")
        sections += [shape_section(shape, rows, image), power_section(rows, sweep_dir, effect)]
        if downstream := downstream_section([r.arm for r in rows], rows[0].arm):  # runs left out of the rows stay out
            sections.append(downstream)
    if len({s[:3] for s in shapes}) > 1:
        plot_ladder(ladder_gaps(per_shape), out_dir / "ladder.png")
        sections.append(ladder_section(per_shape))
    if len({s[3] for s in shapes}) > 1:
        sections.append(blocks_section(per_shape))
    uptrained = uptraining(arms)
    if any(a.uptrained for a in arms):
        sections.append(uptraining_section(arms, uptrained, out_dir))
    largest = one_per_layout(per_shape[-1][1])
    sections.append(frontier_section(largest, out_dir, device, frontier_preset, decode_steps))
    sections.append(attention_section([r.arm for r in largest], prompt, out_dir))
    compared = [r for _, rows in per_shape for r in rows] + uptrained
    left_out = list(dict.fromkeys(sweep.left_out + [line for r in compared for line in r.left_out]))
    for line in left_out:
        print(f"warning: {line}", file=sys.stderr)
    path = out_dir / "report.md"
    path.write_text("\n\n".join([header(sweep_dir, arms, device, left_out), *sections, METHOD]) + "\n")
    return path


def header(sweep_dir: Path, arms: list[Arm], device: torch.device, left_out: list[str]) -> str:
    runs = sum(len(a.runs) for a in arms)
    seeds = sorted({s for a in arms for s in a.seeds})
    where = provenance(device)
    text = (
        f"# Attention ablation: {sweep_dir.name}\n\n{runs} runs in {len(arms)} arms, seeds "
        f"{', '.join(map(str, seeds))}. Measured at report time ({where['date']}) on {device.type} "
        f"({where['machine']}), torch {where['torch']}, gptlab {where['gptlab']}."
    )
    if left_out:
        text += f" Left out of the comparisons ({len(left_out)}):\n\n" + "\n".join(f"- {line}" for line in left_out)
    return f"{text}\n\n{trained_as(arms)}" if runs else text


def trained_as(arms: list[Arm]) -> str:
    """The recipe(s) and data the runs trained under (the blocks head each section below)."""
    runs = [run for a in arms for run in a.runs]
    recipes = sorted({str(run.groups.get("recipe", "not recorded")) for run in runs})
    data = runs[0].settings["data"]  # the same for every run: check_same_data
    tokens = f"{data['tokenizer']} tokenizer" + (f", {data['vocab_size']:,} ids" if data.get("vocab_size") else "")
    return f"Recipe: {', '.join(recipes)}. Data: {data['name']} ({tokens})."


def shape_section(shape, rows: list[Result], image: str) -> str:
    lines = [
        f"## {shape_name(shape)}\n",
        f"Each arm is compared with the baseline (the first row, at its final {rows[0].tokens:,} training tokens) "
        "on the axis its budget was matched on: 'equal tokens' at the baseline's final tokens; 'equal FLOPs' "
        "(match_mha_flops) at its own final evaluation, where it has spent the baseline's training FLOPs; "
        "'own end' for an arm not evaluated at the baseline's tokens. Mean and 95% confidence interval over "
        "seeds (Student t); training FLOPs are one run's at those tokens.\n",
        "| arm | seeds | params | FLOPs/token | compared at | tokens | training FLOPs | val loss (nats) "
        "| val bits/byte | vs baseline (bits/byte) | vs baseline (nats) | p | Holm p | train tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a = r.arm
        comparison = "baseline | baseline | |"
        if c := r.comparison:
            bpb = signed(r.bpb_difference) if r.bpb_difference else "n/a"
            comparison = f"{bpb} | {signed(c.difference)} | {p_value(c.p_value)} | {p_value(c.deciding_p)}"
        train_speed = statistics.median(m["tok_per_s"] for run in a.runs for m in run.metrics if m["kind"] == "train")
        missing = f" ({_seeds(r.missing)} missing)" if r.missing else ""
        lines.append(
            f"| {a.label} | {len(a.runs)}{missing} | {a.params:,} | {a.flops_per_token / 1e6:.2f}M | "
            f"{'baseline' if r.comparison is None else r.axis} | {r.tokens:,} | {r.flops:.4g} | "
            f"{estimate(r.val_loss)} | {estimate(r.val_bpb) if r.val_bpb else 'n/a'} | {comparison} | "
            f"{train_speed:,.0f} |"
        )
    verdicts = [f"- {r.verdict}" for r in rows if r.verdict]
    changed = [(r.arm.label, changes(r.arm, rows[0].arm)) for r in rows[1:]]
    verdicts += [f"- {label} also changes {what}" for label, what in changed if what]
    return "\n".join(lines + ["", *verdicts, "", f"![validation loss]({image})"])


def power_section(rows: list[Result], sweep_dir: Path, effect: float) -> str:
    """What each comparison could have detected, and the seeds that would detect `effect`."""
    lines = [
        "### What these seeds can detect\n",
        f"The smallest difference each test detects {POWER * 100:g}% of the time at alpha {1 - LEVEL:.2g} "
        "(two-sided, noncentral t, from the observed spread of one seed's difference; before Holm's "
        f"adjustment), and the seeds per arm that would detect a difference of {effect:g} nats as often, "
        "if that spread holds.\n",
        f"| comparison | sd of one seed's difference | detectable at these seeds (nats) | seeds for {effect:g} nats |",
        "|---|---|---|---|",
    ]
    needed = {r.arm.name: seeds_needed(r.comparison, effect) for r in rows[1:]}
    for r in rows[1:]:
        c, n = r.comparison, needed[r.arm.name]
        seeds = n if n is not None else "n/a" if math.isnan(c.sd) else f"more than {MAX_SEEDS:,}"
        mde = "n/a" if math.isnan(c.sd) else f"{detectable_effect(c.se, c.df):.4f}"
        lines.append(f"| {r.arm.label} | {'n/a' if math.isnan(c.sd) else f'{c.sd:.4f}'} | {mde} | {seeds} |")
    known = [n for n in needed.values() if n]
    targets = [(rows[0].arm, max(known))] if known else []
    targets += [(r.arm, needed[r.arm.name]) for r in rows[1:] if needed[r.arm.name]]
    if commands := add_seeds_commands(targets, sweep_dir):
        lines += ["", "To add those seeds to this sweep (report.py then reads them with the others):\n", "```"]
        lines += [*commands, "```"]
    return "\n".join(lines)


def ladder_section(per_shape: list[tuple[Arm, list[Result]]]) -> str:
    lines = [
        "## Across model sizes\n",
        "The final validation loss difference of each GQA/MQA arm to its size's MHA arm, against the MHA "
        "model's non-embedding parameters. A gap that widens means fewer key/value heads cost more as the "
        "model grows at this token budget; CIs are 95% over seeds, paired by seed.\n",
        "| MHA model | non-embedding params | tokens | arm | difference (nats) | 95% CI | p |",
        "|---|---|---|---|---|---|---|",
    ]
    for gap in ladder_gaps(per_shape):
        d, tokens = gap.comparison.difference, gap.baseline.runs[0].final["tokens"]
        cells = f"{gap.non_embedding_params:,} | {tokens:,} | {gap.kind} | {d.mean:+.4f} | {ci(d, signed=True)}"
        lines.append(f"| {shape_name(gap.baseline.shape)} | {cells} | {p_value(gap.comparison.p_value)} |")
    return "\n".join(lines + ["", "![gap against model size](ladder.png)"])


def blocks_section(per_shape: list[tuple[Arm, list[Result]]]) -> str:
    """Each block's GQA/MQA differences to its own MHA baseline, the blocks side by side."""
    gaps = ladder_gaps(per_shape)
    seeds = {g.baseline.shape[3]: g.baseline.seeds for g in gaps}  # block -> its baseline's seeds
    cells: dict[tuple[str, str], dict[str, Estimate]] = {}
    for g in gaps:
        cell = cells.setdefault((size_name(g.baseline.shape), layout_name(g.arm.config)), {})
        cell[g.baseline.shape[3]] = g.comparison.difference
    lines = [
        "## The blocks side by side\n",
        "Each block's arms against its own MHA baseline, never against the other block's runs: the final "
        "validation loss difference (nats) and its 95% CI over seeds, paired by seed. Seeds: "
        + "; ".join(f"{block} {_seeds(s)}" for block, s in seeds.items())
        + ".\n",
        "| shape | layout - MHA | " + " | ".join(seeds) + " |",
        "|---|---|" + "---|" * len(seeds),
    ]
    for (size, layout), found in cells.items():
        shown = [signed(found[b]) if b in found else "not run" for b in seeds]
        lines.append(f"| {size} | {layout} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def uptraining_section(arms: list[Arm], rows: list[Uptraining], out_dir: Path) -> str:
    plot_uptraining(arms, rows, out_dir / "uptraining.png")
    lines = [
        "## Uptraining against training from scratch\n",
        "Each uptrained arm starts from the MHA run of the same seed, its K/V heads mean-pooled per group "
        "(Ainslie et al., 2023), and trains on; 'converted' is its evaluation before any step. It is "
        "compared with the same layout trained from scratch, at the same total training tokens (the MHA "
        "source's included). 95% CIs over seeds.\n",
        "| arm | tokens in all | converted (step 0) | after uptraining | from scratch at those tokens |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        scratch = estimate(r.scratch_at_total) if r.scratch_at_total else "not evaluated at these tokens"
        lines.append(
            f"| {r.arm.label} | {r.total_tokens:,} | {estimate(r.converted)} | {estimate(r.final)} | {scratch} |"
        )
    verdicts = [f"- {r.verdict}" for r in rows if r.verdict]
    return "\n".join(lines + ["", *verdicts, "", "![uptraining](uptraining.png)"])


def frontier_section(rows: list[Result], out_dir: Path, device: torch.device, preset, steps: int) -> str:
    """Decode speed of each layout on its trained model and, at a size where the cache matters, on random weights."""
    groups = [("trained", [(r, r.arm.runs[0].model(device)) for r in rows])]
    if preset is not None:
        groups.append(("random weights", [(r, _random_model(preset(r.arm.config), device)) for r in rows]))
    n = torch.get_num_threads()
    threads = f"{n} thread{'s' if n > 1 else ''}"
    lines = [
        "## Quality and decode speed\n",
        f"Greedy KV-cached decode steps timed when the cache already holds a short or a long context "
        f"(fp32, {device.type}, {threads}, best of {DECODE_REPEATS} passes of {steps} steps, sample.py's "
        "weight layout); tokens/s count every row. KV cache: keys and values of every layer in fp32, exact "
        "from the config.\n",
        "| model | layout | KV cache bytes/token | KV cache MiB (one full context) | "
        + " | ".join(f"tok/s b={b} {length}" for b in DECODE_BATCHES for length in ("short", "long"))
        + " |",
        "|---|---|---|---|" + "---|" * 2 * len(DECODE_BATCHES),
    ]
    panels = []
    for title, models in groups:
        points = []
        for row, model in models:
            speeds = measure_layout(model, DECODE_BATCHES, steps=steps, repeats=DECODE_REPEATS)
            short, long = sorted({s.context for s in speeds})
            cache = kv_cache_bytes_per_token(model.config)
            layout = row.arm.label if model.config == row.arm.config else layout_name(model.config)
            mib = kv_cache_bytes(model.config, model.config.block_size) / 2**20
            head = f"| {title} ({_size(model.config)}, context {short} / {long}) | {layout} | {cache:,} | {mib:.3f} | "
            lines.append(head + " | ".join(f"{s.tokens_per_s:,.0f}" for s in speeds) + " |")
            at_long = [s for s in speeds if s.batch == DECODE_BATCHES[-1] and s.context == long][0]
            points.append((layout, row.val_loss, at_long.tokens_per_s, f"{cache / 1024:g} KiB/token"))
        panels.append((f"{title} ({_size(models[0][1].config)}): batch {DECODE_BATCHES[-1]}, context {long}", points))
    plot_frontier(panels, out_dir / "frontier.png")
    return "\n".join(lines + ["", "![quality against decode speed](frontier.png)"])


def attention_section(arms: list[Arm], prompt: str, out_dir: Path) -> str:
    tokenizer = arms[0].runs[0].checkpoint.tokenizer()
    note = ""
    if unknown := tokenizer.unknown_characters(prompt):  # a char tokenizer knows only its training text's characters
        prompt = "".join(c for c in prompt if c not in unknown) or "".join(tokenizer.chars[:24])
        lacks = " ".join(map(repr, unknown))
        note = f"\n\nThe {tokenizer.name} tokenizer lacks {lacks}, so the prompt shown is {prompt!r}."
    ids = tokenizer.encode(prompt)[: arms[0].config.block_size]
    last_layer = [attention_maps(a.runs[0].model(torch.device("cpu")), torch.tensor([ids]))[-1][0] for a in arms]
    layouts = [AttentionLayout(a.label, a.config.n_kv_head, weights) for a, weights in zip(arms, last_layer)]
    title = f"Last-layer attention of each layout (seed {arms[0].seeds[0]}) for {prompt!r}"
    plot_attention(layouts, token_labels([tokenizer.decode([i]) for i in ids]), out_dir / "attention.png", title)
    return "## Attention patterns\n\n![attention](attention.png)" + note


METHOD = """## How this was measured

- Val loss is a run's evaluation in nats per token: the mean over windows that are the same for every
  run and seed on the same data (eval_iters batches, or with eval_whole_val the whole val split); bits
  per byte divide the same total by the UTF-8 bytes the evaluated tokens stand for, so it compares
  across tokenizers. Every run here has the same tokenizer (the report refuses others): models on
  different tokenizers compare in bits per byte, never in nats per token. On one tokenizer and the same
  windows a run's bits per byte are its nats times one constant, so the table's differences in both
  units have the same p-values, which the verdicts and the power section state in nats.
- ± is a 95% Student t confidence interval over seeds. "vs baseline" is the mean of per-seed
  differences (arm minus baseline) with its 95% CI and a two-sided paired t-test p-value when both arms
  ran the same seeds, else a Welch t-test; a positive difference means a higher (worse) loss. Holm p
  adjusts the p-values of a section's comparisons for their number, and the verdicts use it; the CIs
  are not adjusted.
- For one seed every arm sees the same batches in the same order and starts from the same weights
  wherever the shapes allow (training/ and model/init.py), which is what makes pairing by seed valid.
- FLOPs/token are training FLOPs (forward and backward) at the full context; train tok/s is the median
  of the logged training throughput over all of an arm's runs."""


def signed(e: Estimate) -> str:
    """A difference with its interval: '+0.0107 (-0.0086..+0.0300)'."""
    return f"{e.mean:+.4f} ({ci(e, signed=True)})"


def estimate(e: Estimate) -> str:
    return f"{e.mean:.4f}" if e.n < 2 else f"{e.mean:.4f} ± {e.half_width:.4f}"


def ci(e: Estimate, signed: bool = False) -> str:
    fmt = "{:+.4f}" if signed else "{:.4f}"  # no CI: one value on a side, no spread to build an interval from
    return "no CI" if math.isnan(e.low) else f"{fmt.format(e.low)}..{fmt.format(e.high)}"


def _seeds(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def _size(config) -> str:
    return f"{config.n_layer} layers x {config.n_embd}"


def _curves_image(shape) -> str:
    block = "" if shape[3] == GPT2_BLOCK else "_" + "".join(c for c in shape[3].lower() if c.isalnum())
    return f"val_loss_L{shape[0]}d{shape[1]}{block}.png"


def _random_model(config, device: torch.device) -> GPT:
    """Seeded random weights of config, on device in the layout load_model gives a trained model."""
    torch.manual_seed(0)
    return to_decode_layout(GPT(config).to(device).eval())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python report.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir", type=Path, help="the directory holding the runs (at any depth)")
    parser.add_argument("--out", type=Path, help="where report.md and the plots go (default: sweep_dir)")
    parser.add_argument("--baseline", help="the arm every other is compared with (default: MHA from scratch)")
    parser.add_argument("--decode-steps", type=int, default=16, help="decode steps per timed pass")
    skip = "skip the decode measurement of each layout at GPT-2 small size"
    parser.add_argument("--no-gpt2-decode", action="store_true", help=skip)
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="text whose attention the heatmaps show")
    effect = "the loss difference in nats to count the seeds for, at 80%% power (default 0.01)"
    parser.add_argument("--effect", type=float, default=DEFAULT_EFFECT, help=effect)
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        sys.exit(f"error: {args.sweep_dir} is not a directory")
    if args.decode_steps < 1:
        sys.exit(f"error: --decode-steps must be at least 1, got {args.decode_steps}")
    if not args.effect > 0:
        sys.exit(f"error: --effect must be a positive number of nats, got {args.effect}")
    if not args.prompt:
        sys.exit("error: --prompt is empty: the heatmaps need at least one token of text")
    if args.out is not None and args.out.exists() and not args.out.is_dir():
        sys.exit(f"error: --out {args.out} is a file: pass a directory for report.md and the plots")
    with exits(writing=str(args.out or args.sweep_dir)):  # ValueError: a malformed metrics.jsonl or --baseline
        preset = None if args.no_gpt2_decode else gpt2_sized
        kwargs = dict(prompt=args.prompt, baseline=args.baseline, decode_steps=args.decode_steps, effect=args.effect)
        path = write_report(args.sweep_dir, args.out or args.sweep_dir, frontier_preset=preset, **kwargs)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
