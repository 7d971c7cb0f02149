r"""Where does each agent's memory stop working? Torch-native memory tasks by memory length.

Every run is ``python -m rltrans.train`` on one task at one memory length with one agent and
seed, at a fixed env-step budget, then ``python -m rltrans.evaluate`` over 100 deterministic
episodes of its last checkpoint (100 envs at once), both in one process per run. Runs go to
parallel processes (``--jobs``) and to folders of their own under ``--out``; a run whose
result is on disk is not done again, an interrupted one resumes from its checkpoint, so the
suite can be stopped and started at will.

Printed: one table (task, length, agent, env steps per run (``--steps``, or a task's own
``--task-steps TASK=STEPS``): final evaluated return over the seeds as mean and
range, env steps until the deterministic evaluations during training (``algo.eval_every``)
first reach 90 % of the task's best return, SPS). Written to ``--out``: ``table.md``,
``results.json`` and two pictures, ``curves.png`` (evaluated return against env steps, mean
and 95 % band over seeds, a panel per task and length) and ``by_length.png`` (final
evaluated return against memory length, a line per agent, a panel per task).

The memory length is the distance the task asks the agent to remember over: the episode
length of repeat_first, count_recall and the T-mazes (the cue comes first), k for
repeat_previous, the sequence length for autoencode. The default agents' window is 64 steps
(gtrxl: 2 layers x M=32).

    python benchmarks/memory_suite.py --quick          # < 30 min on 2 cores: 5 tasks, 3 lengths
    python benchmarks/memory_suite.py                  # the full grid (a GPU: --device cuda)
    python benchmarks/memory_suite.py --tasks passive_tmaze --lengths 16 64 256 \
        --agents gtrxl gru --steps 500000 --jobs 4
    python benchmarks/memory_suite.py --popgym medium --tasks repeat_first count_recall \
        autoencode --agents gtrxl_fit gru_fit --steps 2000000 --task-steps repeat_first=1000000

``--suite popgym`` runs POPGym's own envs by Gymnasium id instead (benchmarks/popgym_suite.py:
its options follow it, e.g. ``--suite popgym --quick``).

``--popgym easy|medium|hard`` runs each task at POPGym's preset of that level, every setting
of it (count_recall's medium also counts 4 symbols, not 2), in place of ``--lengths``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
from common import logged_sps, named_steps, run_grid, steps_to, train_and_evaluate

# Task -> its env option, how a memory length becomes env overrides, and which constructor
# argument is the memory length (read from POPGym's presets under --popgym).
# Returns are POPGym's, scaled to [-1, 1]; the T-mazes' is +1 / -1 at the decision.
TASKS: dict[str, dict] = {
    "repeat_first": {
        "env": "repeat_first",
        "length": lambda d: [f"env.kwargs.length={d}"],
        "memory": "length",
    },
    "repeat_previous": {
        "env": "repeat_previous",
        "length": lambda d: [f"env.kwargs.k={d}", f"env.kwargs.episode_length={2 * d + 16}"],
        "memory": "k",
    },
    "count_recall": {
        "env": "count_recall",
        "length": lambda d: [f"env.kwargs.length={d}"],
        "memory": "length",
    },
    "autoencode": {
        "env": "autoencode",
        "length": lambda d: [f"env.kwargs.length={d}"],
        "memory": "length",
    },
    "passive_tmaze": {
        "env": "passive_tmaze",
        "length": lambda d: [f"env.kwargs.length={d}"],
        "memory": "length",
    },
    "tmaze": {"env": "tmaze", "length": lambda d: [f"env.kwargs.length={d}"], "memory": "length"},
}
POPGYM_LEVELS = ("easy", "medium", "hard")
BEST_RETURN = 1.0  # every task's best return
# The plain names are the agents as configured, memory not fitted to the task
# (agent.horizon=null: gtrxl's window 2 x 32 steps and its mixed long memory, segments of 128
# steps); *_fit are the defaults, agent.horizon=auto (window, rollouts and segments fitted to
# the task's time limit).
FIXED = "agent.horizon=null"
RECONSTRUCTION_COEF = 0.1  # the observation-reconstruction loss weight of the *_recon agents
AGENTS: dict[str, list[str]] = {
    "gtrxl": ["agent=gtrxl", FIXED],
    "gtrxl_fit": ["agent=gtrxl"],
    "gtrxl_linear": ["agent=gtrxl", FIXED, "agent.long_memory=linear"],
    "gtrxl_delta": ["agent=gtrxl", FIXED, "agent.long_memory=delta"],
    "gtrxl_additive": ["agent=gtrxl", FIXED, "agent.long_memory=additive"],
    "gtrxl_compressive": ["agent=gtrxl", FIXED, "agent.long_memory=compressive"],
    "gtrxl_long": ["agent=gtrxl", FIXED, "agent.memory=128", "algo.segment_length=64"],
    "lstm": ["agent=lstm", FIXED],
    "gru": ["agent=gru", FIXED],
    "gru_fit": ["agent=gru"],
    "mlp": ["agent=mlp"],
    # with the observation-reconstruction loss (its effect on memory: curves with and without)
    "gtrxl_fit_recon": ["agent=gtrxl", f"algo.reconstruction_coef={RECONSTRUCTION_COEF}"],
    "gru_fit_recon": ["agent=gru", f"algo.reconstruction_coef={RECONSTRUCTION_COEF}"],
}
PRESETS = {
    "quick": {
        "tasks": ["passive_tmaze", "repeat_first", "repeat_previous", "count_recall", "autoencode"],
        "lengths": [8, 96, 256],
        "agents": ["gtrxl", "lstm", "gru", "mlp"],
        "seeds": 3,
        "steps": 40_000,
        "num_envs": 16,
    },
    "full": {
        "tasks": list(TASKS),
        "lengths": [16, 64, 256, 1024],
        "agents": list(AGENTS),
        "seeds": 3,
        "steps": 2_000_000,
        "num_envs": 64,
    },
}
EVAL_EPISODES = 100
# Learning curves and steps to 90 %: the deterministic evaluations made during training
# (algo.eval_every), as the final return is; sampled training returns stay lower.
CURVE = "eval/episodic_return"


@dataclass
class Result:
    """One finished run: its evaluated return, steps to 90 % of the best, speed."""

    task: str
    length: int
    agent: str
    seed: int
    eval_return: float
    steps_to_90: int | None
    sps: float
    run_dir: str


def run_name(task: str, length: int, agent: str, seed: int, popgym: str | None = None) -> str:
    """The folder of one run under --out."""
    level = f"-{popgym}" if popgym else ""
    return f"{task}-L{length}{level}-{agent}-s{seed}"


def popgym_preset(task: str, level: str) -> dict[str, int]:
    """POPGym's settings of ``task`` at ``level``; ValueError for a task POPGym lacks."""
    from rltrans.envs.torch_envs import TORCH_ENVS

    presets = getattr(TORCH_ENVS[TASKS[task]["env"]], "popgym_presets", None)
    if not presets:
        have = [t for t in TASKS if getattr(TORCH_ENVS[TASKS[t]["env"]], "popgym_presets", None)]
        raise ValueError(f"--popgym: POPGym has no task {task!r}; it has {', '.join(have)}")
    return dict(presets[level])


def cells(tasks: list[str], lengths: list[int], popgym: str | None) -> list[tuple[str, int]]:
    """(task, memory length) of the grid: every length per task, or each task's POPGym one."""
    if popgym is None:
        return [(task, length) for task in tasks for length in lengths]
    return [(task, popgym_preset(task, popgym)[TASKS[task]["memory"]]) for task in tasks]


def env_overrides(task: str, length: int, popgym: str | None) -> list[str]:
    """The train overrides that set the task's env at ``length`` (or its POPGym preset)."""
    if popgym is None:
        return TASKS[task]["length"](length)
    return [f"env.kwargs.{k}={v}" for k, v in popgym_preset(task, popgym).items()]


def one_run(task: str, length: int, agent: str, seed: int, args: argparse.Namespace) -> Result:
    """Train (or resume, or reuse) one run and evaluate its last checkpoint."""
    run = Path(args.out) / run_name(task, length, agent, seed, args.popgym)
    done = run / "result.json"
    if done.is_file():
        return Result(**json.loads(done.read_text()))
    steps = budget(task, args)
    train = [
        f"env={TASKS[task]['env']}",
        *env_overrides(task, length, args.popgym),
        *AGENTS[agent],
        f"env.num_envs={args.num_envs}",
        f"seed={seed}",
        f"total_steps={steps}",
        f"device={args.device}",
        f"run_dir={run}",
        f"algo.eval_every={args.eval_every}",
        f"algo.eval_episodes={args.num_envs}",
        "progress=false",
        "torch_threads=1",
        "compile=false",
    ]
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true", f"run_dir={run}", f"total_steps={steps}", "progress=false"]
    evaluate = [
        f"checkpoint={run}",
        f"episodes={EVAL_EPISODES}",
        f"num_envs={EVAL_EPISODES}",  # the torch-native tasks step 100 envs as cheaply as 16
        f"device={args.device}",
        "torch_threads=1",
        "progress=false",
    ]
    trained, scored = train_and_evaluate(run, train, evaluate)
    result = Result(
        task,
        length,
        agent,
        seed,
        float(scored["mean_return"]),
        steps_to(run, CURVE, 0.9 * BEST_RETURN),
        float(trained.get("SPS") or 0.0) or logged_sps(run),
        str(run),
    )
    done.write_text(json.dumps(asdict(result)))
    return result


def budget(task: str, args: argparse.Namespace) -> int:
    """The env steps of each run of ``task``: its --task-steps entry, else --steps."""
    return args.task_steps.get(task, args.steps)


def task_steps(entries: list[str], tasks: list[str]) -> dict[str, int]:
    """--task-steps TASK=STEPS entries as a dict; ValueError naming a bad entry."""
    return named_steps(entries, tasks, "--task-steps", "TASK")


def table(
    results: list[Result],
    grid: list[tuple[str, int]],
    agents: list[str],
    budgets: dict[str, int],
) -> str:
    """The markdown table: a row per task, length and agent, with the env steps of its runs."""
    rows = [
        "| task | length | agent | env steps | eval return (mean, min-max over seeds) "
        "| steps to 90 % | SPS |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, length in grid:
        for agent in agents:
            mine = [r for r in results if (r.task, r.length, r.agent) == (task, length, agent)]
            if not mine:
                continue
            values = [r.eval_return for r in mine]
            reached = [r.steps_to_90 for r in mine if r.steps_to_90 is not None]
            to90 = (
                f"{statistics.median(reached) / 1000:.0f}k ({len(reached)}/{len(mine)})"
                if reached
                else f"never (0/{len(mine)})"
            )
            sps = statistics.mean(r.sps for r in mine)
            rows.append(
                f"| {task} | {length} | {agent} | {budgets[task]:,} "
                f"| {statistics.mean(values):.2f} "
                f"({min(values):.2f} to {max(values):.2f}) | {to90} | {sps:,.0f} |"
            )
    return "\n".join(rows)


def draw(results: list[Result], grid: list[tuple[str, int]], agents: list[str], out: Path) -> None:
    """curves.png (evaluated return during training, mean and band over seeds), by_length.png."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rltrans.plot import mean_band, read_curve

    colours = {a: f"C{i}" for i, a in enumerate(agents)}
    tasks = list(dict.fromkeys(task for task, _ in grid))
    rows = [[length for t, length in grid if t == task] for task in tasks]
    columns = max(len(row) for row in rows)
    side_by_side = columns == 1  # one length per task (a POPGym level): the tasks in one row
    shape = (1, len(tasks)) if side_by_side else (len(tasks), columns)
    # wide enough for the title over a single panel
    fig = Figure(figsize=(max(3.2 * shape[1], 4.4), 2.4 * shape[0] + 0.5), layout="constrained")
    FigureCanvasAgg(fig)
    panels = fig.subplots(*shape, squeeze=False, sharey=True)
    axes = panels.T if side_by_side else panels  # axes[task][length]
    for i, (task, lengths) in enumerate(zip(tasks, rows, strict=True)):
        for ax in axes[i][len(lengths) :]:
            ax.set_visible(False)
        for j, length in enumerate(lengths):
            ax = axes[i][j]
            for agent in agents:
                runs = [
                    Path(r.run_dir)
                    for r in results
                    if (r.task, r.length, r.agent) == (task, length, agent)
                ]
                if not runs:
                    continue
                group = mean_band(agent, [read_curve(r, CURVE, "step") for r in runs])
                low, high = (np.clip(v, -BEST_RETURN, BEST_RETURN) for v in (group.low, group.high))
                ax.plot(group.x, group.mean, color=colours[agent], label=agent, linewidth=1)
                ax.fill_between(group.x, low, high, color=colours[agent], alpha=0.2, linewidth=0)
            ax.set_title(f"{task}, length {length}", fontsize="small")
            ax.grid(alpha=0.3)
            if side_by_side or i == len(tasks) - 1:
                ax.set_xlabel("env steps", fontsize="small")
            if (i if side_by_side else j) == 0:
                ax.set_ylabel("eval return during training", fontsize="small")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(agents), fontsize="small")
    fig.suptitle("mean over seeds, 95 % band (clipped to the return range)", fontsize="small")
    fig.savefig(out / "curves.png", dpi=110)

    fig = Figure(figsize=(3.4 * len(tasks), 2.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(tasks), squeeze=False, sharey=True)[0]
    for ax, task, lengths in zip(axes, tasks, rows, strict=True):
        for agent in agents:
            xs, means, lows, highs = [], [], [], []
            for length in lengths:
                values = [
                    r.eval_return
                    for r in results
                    if (r.task, r.length, r.agent) == (task, length, agent)
                ]
                if values:
                    xs.append(length)
                    means.append(statistics.mean(values))
                    lows.append(min(values))
                    highs.append(max(values))
            if xs:
                ax.plot(xs, means, marker="o", color=colours[agent], label=agent, linewidth=1)
                ax.fill_between(xs, lows, highs, color=colours[agent], alpha=0.15, linewidth=0)
        ax.axvline(64, color="grey", linestyle=":", linewidth=1)  # the default window
        ax.set_xscale("log", base=2)
        ax.set_title(task, fontsize="small")
        ax.set_xlabel("memory length (steps)", fontsize="small")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"eval return ({EVAL_EPISODES} episodes)", fontsize="small")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(agents), fontsize="small")
    fig.suptitle(
        "mean and range over seeds; dotted: the default window (64 steps)", fontsize="small"
    )
    fig.savefig(out / "by_length.png", dpi=110)


def main() -> None:
    """Run the grid (in parallel, resumably), print the table, write the pictures."""
    suite = argparse.ArgumentParser(add_help=False)
    suite.add_argument("--suite", choices=("torch", "popgym"), default="torch")
    chosen, rest = suite.parse_known_args()
    if chosen.suite == "popgym":  # POPGym's own envs by Gymnasium id: popgym_suite.py
        import popgym_suite

        popgym_suite.main(rest)
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the < 30 min preset for 2 cores")
    p.add_argument("--tasks", nargs="+", choices=list(TASKS))
    p.add_argument("--lengths", nargs="+", type=int)
    p.add_argument(
        "--popgym", choices=POPGYM_LEVELS, help="each task at POPGym's preset, not --lengths"
    )
    p.add_argument("--agents", nargs="+", choices=list(AGENTS))
    p.add_argument("--seeds", type=int, help="seeds 1..N")
    p.add_argument("--steps", type=int, help="env steps per run")
    p.add_argument(
        "--task-steps",
        nargs="+",
        default=[],
        metavar="TASK=STEPS",
        help="env steps per run of these tasks, in place of --steps",
    )
    p.add_argument("--num-envs", type=int, help="envs per run")
    p.add_argument("--eval-every", type=int, default=4, help="updates between evaluations")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="runs/memory_suite", help="runs, table and pictures")
    args = p.parse_args()
    preset = PRESETS["quick" if args.quick else "full"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        tasks_lengths = cells(args.tasks, args.lengths, args.popgym)
        args.task_steps = task_steps(args.task_steps, args.tasks)
    except ValueError as error:
        p.error(str(error))
    grid = [
        (task, length, agent, seed)
        for seed in range(1, args.seeds + 1)
        for task, length in tasks_lengths
        for agent in args.agents
    ]
    print(
        f"# {len(grid)} runs of {', '.join(f'{budget(t, args):,}' for t in args.tasks)} env "
        f"steps ({', '.join(args.tasks)}) in {out}, {args.jobs} at a time",
        flush=True,
    )
    start = time.monotonic()
    results = run_grid(
        args.jobs,
        {run_name(*cell, args.popgym): partial(one_run, *cell, args) for cell in grid},
        lambda r: f"eval {r.eval_return:.2f}, {r.sps:,.0f} SPS",
    )
    text = table(results, tasks_lengths, args.agents, {t: budget(t, args) for t in args.tasks})
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    draw(results, tasks_lengths, args.agents, out)
    minutes = (time.monotonic() - start) / 60
    print(f"# {minutes:.1f} min; pictures: {out / 'curves.png'}, {out / 'by_length.png'}")


if __name__ == "__main__":
    main()
