"""What the report concludes: each arm against its shape's baseline, uptrained arms
against training from scratch at the same total tokens, and the gaps along a size ladder."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ablation.fairness import check_against_baseline, check_independent, check_seeds_alike
from ablation.runs import GPT2_BLOCK, Arm, Run
from ablation.stats import Comparison, Estimate, holm, mean_ci, paired_difference, verdict, welch_difference

EQUAL_TOKENS, EQUAL_FLOPS, OWN_END = "equal tokens", "equal FLOPs", "own end"


@dataclass
class Result:
    arm: Arm
    tokens: int  # the training tokens the figures are taken at
    axis: str  # what the arm is compared with the baseline at: EQUAL_TOKENS, EQUAL_FLOPS or OWN_END
    val_loss: Estimate
    val_bpb: Estimate | None  # None for runs that logged no bits per byte
    comparison: Comparison | None  # against the baseline; None for the baseline itself
    verdict: str | None
    left_out: list[str] = field(default_factory=list)  # a line for each run of the arm not evaluated at `tokens`
    missing: list[int] = field(default_factory=list)  # seeds the other arms ran (of the baseline's), not this one
    bpb_difference: Estimate | None = None  # against the baseline in bits per byte, where both logged it

    @property
    def flops(self) -> float:
        """The training FLOPs one run of the arm had spent at `tokens`."""
        return self.arm.flops_per_token * self.tokens


def difference(baseline: list[float], baseline_seeds: list[int], values: list[float], seeds: list[int]) -> Comparison:
    """Paired by seed when both arms ran the same seeds (the same batches, the same
    initial weights where the shapes allow); otherwise an unpaired Welch test."""
    return (paired_difference if baseline_seeds == seeds else welch_difference)(baseline, values)


def baseline_of(arms: list[Arm], name: str | None) -> Arm:
    """The arm named `name`; else the MHA arm under its default name (kv<n_head>), else any
    MHA arm trained from scratch, else the first arm."""
    if name is not None:
        match = [a for a in arms if a.name == name]
        if not match:
            raise ValueError(f"--baseline {name}: no such arm; the arms are {', '.join(a.name for a in arms)}")
        return match[0]
    scratch_mha = [a for a in arms if a.config.attention_kind == "MHA" and not a.uptrained]
    default = [a for a in scratch_mha if a.name == f"kv{a.config.n_head}"]
    return (default or scratch_mha or arms)[0]


def results(arms: list[Arm], baseline: Arm) -> list[Result]:
    """The baseline first, then every arm trained from scratch (uptrained arms have their own
    comparison), each on the axis its budget was matched on: a match_mha_flops arm at its own
    final evaluation (the baseline's training FLOPs); any other at the baseline's final tokens,
    or at its own end where it was not evaluated there. A run not evaluated there is left out,
    and said so. The comparisons are one family for Holm's adjustment, which the verdicts use."""
    tokens = _end(baseline)
    ran = [baseline] + [a for a in arms if a is not baseline and not a.uptrained]
    compared = [_compared(arm, tokens, _windows(baseline, tokens)) for arm in ran]
    base = compared[0][0]
    rows = []
    for (arm, at, axis, left_out), missing in zip(compared, _missing_seeds(ran, [c[0] for c in compared])):
        check_seeds_alike(arm)
        losses, bpb = arm.at_tokens(at), _bpb(arm, at)
        comparison = bpb_difference = None
        if arm is not base:
            check_against_baseline(arm, base)
            check_independent(arm, base)
            comparison = difference(base.at_tokens(tokens), base.seeds, losses, arm.seeds)
            base_bpb = _bpb(base, tokens)
            if bpb and base_bpb:
                bpb_difference = difference(base_bpb, base.seeds, bpb, arm.seeds).difference
        bpb_ci = mean_ci(bpb) if bpb else None
        rows.append(Result(arm, at, axis, mean_ci(losses), bpb_ci, comparison, None, left_out, missing, bpb_difference))
    adjusted = holm([r.comparison for r in rows[1:]])
    return rows[:1] + [
        replace(r, comparison=c, verdict=verdict(r.arm.label, base.label, c)) for r, c in zip(rows[1:], adjusted)
    ]


def _bpb(arm: Arm, tokens: int) -> list[float] | None:
    """Each seed's val bits per byte at `tokens`, or None where a run logged none (runs that predate it)."""
    values = arm.at_tokens(tokens, "val_bpb") if all("val_bpb" in r.final for r in arm.runs) else None
    return values if values and None not in values else None


def _compared(arm: Arm, baseline_tokens: int, baseline_windows: set) -> tuple[Arm, int, str, list[str]]:
    """The arm with the runs evaluated where it is compared, the tokens there, the axis, and a
    line for each run left out. Equal tokens needs an evaluation there on the baseline's windows:
    an arm that trains longer under eval_whole_val=final was evaluated on a sample there."""
    if arm.matched_flops:
        at, axis, windows = _end(arm), EQUAL_FLOPS, None
    elif any(_evaluated(arm, run, baseline_tokens, baseline_windows) for run in arm.runs):
        at, axis, windows = baseline_tokens, EQUAL_TOKENS, baseline_windows
    else:
        at, axis, windows = _end(arm), OWN_END, None
    kept, left_out = _reaching(arm, at, windows)
    return kept, at, axis, left_out


def _reaching(arm: Arm, tokens: int, windows: set | None = None) -> tuple[Arm, list[str]]:
    """The arm with only its runs evaluated at `tokens` (on one of `windows`, unless None),
    and a line for each run left out."""
    kept = [run for run in arm.runs if _evaluated(arm, run, tokens, windows)]
    left_out = [_why_left_out(arm, run, tokens) for run in arm.runs if run not in kept]
    return (replace(arm, runs=kept) if left_out else arm), left_out


def _end(arm: Arm) -> int:
    """The tokens of the arm's last evaluation: where its longest run stopped."""
    return max(run.final["tokens"] for run in arm.runs) + arm.pretraining_tokens


def _evaluated(arm: Arm, run: Run, tokens: int, windows: set | None) -> bool:
    return any(
        r["tokens"] + arm.pretraining_tokens == tokens and (windows is None or r.get("val_windows") in windows)
        for r in run.evals
    )


def _why_left_out(arm: Arm, run: Run, tokens: int) -> str:
    end = run.final["tokens"] + arm.pretraining_tokens
    if end < tokens:
        return (
            f"{run.path}: stopped at {end:,} tokens (step {run.final['step']}), before "
            f"the {tokens:,} tokens arm {arm.name} is compared at; left out of that comparison"
        )
    return (
        f"{run.path}: not evaluated at {tokens:,} tokens on the baseline's validation windows, where arm "
        f"{arm.name} is compared; left out of that comparison"
    )


def _missing_seeds(ran: list[Arm], compared: list[Arm]) -> list[list[int]]:
    """Per arm (the baseline first; as run, and as compared), the seeds it lacks of those run by the
    arms sharing a seed with the baseline (an arm run under other seeds on purpose lacks none)."""
    seeds = [set(arm.seeds) for arm in ran]
    expected = set().union(*(s for s in seeds if s & seeds[0]))
    return [sorted(expected - set(arm.seeds)) if s & seeds[0] else [] for s, arm in zip(seeds, compared)]


def _windows(arm: Arm, tokens: int) -> set:
    """The val windows counted by the arm's evaluations at `tokens` (None for runs that predate the count)."""
    return {
        r.get("val_windows") for run in arm.runs for r in run.evals if r["tokens"] + arm.pretraining_tokens == tokens
    }


def one_per_layout(rows: list[Result]) -> list[Result]:
    """One arm per number of key/value heads (the baseline, or the arm under its default
    name kv<n>, else the first), for measurements that depend on the layout only."""
    chosen: dict[int, Result] = {}
    for row in rows:
        kv = row.arm.config.n_kv_head
        if kv not in chosen or (row.arm.name == f"kv{kv}" and chosen[kv] is not rows[0]):
            chosen[kv] = row
    return sorted(chosen.values(), key=lambda r: -r.arm.config.n_kv_head)


@dataclass
class Uptraining:
    arm: Arm  # uptrained
    scratch: Arm  # the same layout from scratch
    converted: Estimate  # the loss right after pooling, before any training
    final: Estimate
    total_tokens: int
    scratch_at_total: Estimate | None  # from scratch at the same total tokens
    comparison: Comparison | None
    verdict: str | None
    left_out: list[str] = field(default_factory=list)  # a line for each run of either arm not evaluated at total_tokens


def uptraining(arms: list[Arm]) -> list[Uptraining]:
    """Each uptrained arm at its end (a seed that stopped before is left out, and said so)
    against the same layout from scratch at the same total tokens, if evaluated there."""
    rows = []
    for ran in (a for a in arms if a.uptrained):
        arm, left_out = _reaching(ran, _end(ran))
        check_seeds_alike(arm)
        total = _end(arm)
        scratch = [
            a for a in arms if not a.uptrained and a.shape == arm.shape and a.config.n_kv_head == arm.config.n_kv_head
        ]
        if not scratch:
            continue
        there = [a for a in scratch if any(_evaluated(a, run, total, None) for run in a.runs)]
        source, not_there = _reaching(there[0], total) if there else (scratch[0], [])
        left_out += not_there
        at_total = source.at_tokens(total)
        comparison = None if at_total is None else difference(at_total, source.seeds, arm.finals(), arm.seeds)
        converted, final = mean_ci([r.evals[0]["val_loss"] for r in arm.runs]), mean_ci(arm.finals())
        scratch_ci = mean_ci(at_total) if at_total is not None else None
        rows.append(Uptraining(arm, source, converted, final, total, scratch_ci, comparison, None, left_out))
    tested = [r for r in rows if r.comparison is not None]  # one family for Holm's adjustment
    for row, comparison in zip(tested, holm([r.comparison for r in tested])):
        row.comparison = comparison
        name = f"{row.arm.name} ({row.total_tokens:,} tokens in all)"
        row.verdict = verdict(name, f"{row.scratch.name} at the same tokens", comparison)
    return sorted(rows, key=lambda r: (-r.arm.config.n_kv_head, r.total_tokens))  # 5% before 10%


@dataclass
class Gap:
    kind: str  # GQA or MQA, with the block when it is not GPT-2's ("MQA, Llama block")
    arm: Arm
    baseline: Arm  # the shape's MHA arm
    non_embedding_params: int  # of the baseline model
    comparison: Comparison


def ladder_gaps(shapes: list[tuple[Arm, list[Result]]]) -> list[Gap]:
    """Per shape (its baseline and results), the difference of each scratch GQA/MQA arm to it."""
    gaps = []
    for baseline, rows in shapes:
        block = "" if baseline.shape[3] == GPT2_BLOCK else f", {baseline.shape[3]}"
        for row in rows:
            if row.comparison is not None and not row.arm.uptrained and row.arm.config.attention_kind != "MHA":
                kind = row.arm.config.attention_kind + block
                gaps.append(Gap(kind, row.arm, baseline, baseline.non_embedding_params, row.comparison))
    return gaps
