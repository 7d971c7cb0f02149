r"""POPGym's own envs, run the way a user runs a Gymnasium env: one score per env and agent.

Every run is ``python -m rltrans.train env=gym env.id=popgym:popgym-<Name><Level>-v0
agent=<agent>`` with nothing else but the seed, the budget and logging (the agents' defaults,
no memory flag), then ``python -m rltrans.evaluate`` over 100 deterministic episodes of its last
checkpoint, both in one process per run. Runs go to parallel processes (``--jobs``) and to
folders of their own under ``--out``; a finished run is not done again and an interrupted one
resumes from its checkpoint, so the suite can be stopped and started at will.

The score is POPGym's (Morad et al. 2023): the mean episodic return normalised to [0, 1] by
the env's least and greatest return (POPGym scales every env's return into [-1, 1]; the
cart-pole variants pay only for surviving steps, so theirs is [0, 1]). Chance is the score of
the uniform random policy, measured here over 100 episodes per env. ``--twins`` also runs the
torch-native twin of every env that has one (repeat-first, repeat-previous, count-recall,
autoencode) at the same preset, with the same agents and seeds (``agent.horizon=auto`` fits
both alike: the twin's declared time limit is the original's observed episode length), to show
that an agent learns the twin as it learns the original. ``--set`` adds train overrides to
every run (or, with an ``AGENT:`` prefix, to one agent's), to measure a candidate default on
the whole suite (give each setting an ``--out`` of its own: a finished run is reused, whatever
``--set`` says now).

Written to ``--out``: ``table.md`` (score per env and agent over the seeds: mean, range, env
steps to a score of 0.9, SPS; then the mean over each level, and for each level on how many
of the envs above chance each agent is ahead), ``results.json``, ``bars.png`` (final score
per env, a bar per agent, the seeds' range and chance marked) and ``curves.png`` (the score
of the deterministic evaluations during training, mean and range over seeds, a panel per env).

    python benchmarks/memory_suite.py --suite popgym --quick    # 28 runs, about an hour on 2 cores
    python benchmarks/memory_suite.py --suite popgym            # Easy and Medium, 3 seeds
    python benchmarks/memory_suite.py --suite popgym --levels medium \
        --envs RepeatFirst CountRecall --seeds 3 --twins --jobs 2

``--speed`` runs no grid: it times both agents' whole PPO updates (rollout, advantages,
learning) on each chosen env at their defaults, their short runs alternating in one process
over ``--rounds`` rounds, and writes the median SPS and the ratio per round to ``speed.md``.

    python benchmarks/memory_suite.py --suite popgym --speed --levels easy medium \
        --envs RepeatFirst PositionOnlyCartPole
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from common import logged_sps, named_steps, run_grid, steps_to, train_and_evaluate

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LEVELS = ("easy", "medium", "hard")
AGENTS = {"gtrxl": ["agent=gtrxl"], "gru": ["agent=gru"]}
# The torch-native twin of a POPGym env: its env option (presets: the env class's own table).
TWINS = {
    "RepeatFirst": "repeat_first",
    "RepeatPrevious": "repeat_previous",
    "CountRecall": "count_recall",
    "Autoencode": "autoencode",
}
STEPS = 1_000_000  # the default budget per run
ENV_STEPS = {"CountRecallMedium": 3_000_000}  # ... and the envs that get more
PRESETS = {
    # 28 runs (14 envs x 2 agents); at 300k steps a run took 2.5 min, two at a time (2 cores)
    "quick": {"levels": ["easy"], "seeds": 1, "steps": 200_000, "env_steps": {}},
    "full": {"levels": ["easy", "medium"], "seeds": 3, "steps": STEPS, "env_steps": ENV_STEPS},
}
NUM_ENVS = 16  # envs per run (training); the evaluations during training use as many
EVAL_EPISODES = 100
CHANCE_EPISODES = 100
TARGET = 0.9  # the score whose first crossing is reported
ABOVE_CHANCE = 0.05  # a score counts as above chance when it beats chance's by more than this
CURVE = "eval/episodic_return"
# The curves figure, one panel per env: shown at the docs column's width (about 700 px), two
# panels to a row keep 10 pt text at about 13 px on screen; four made it 6 px, titles touching.
CURVES_COLUMNS = 2
PANEL_INCHES = (3.7, 2.2)  # width, height
CURVES_FONT = 10  # points: ticks, labels and legend (titles one more)
CURVES_DPI = 110
DOCS_WIDTH_PX = 700


@functools.cache
def return_range(env_id: str) -> tuple[float, float]:
    """The least and greatest episodic return of a POPGym env: [-1, 1] as POPGym scales them;
    the cart-poles pay only for surviving steps, [0, 1]; Battleship's all-miss episode pays
    -L / (L - hits needed)."""
    name = env_id.split("popgym-")[-1]
    if "cartpole" in name.lower():
        return (0.0, 1.0)
    if name.startswith("Battleship"):
        import gymnasium as gym

        env = gym.make(env_id).unwrapped
        steps, hits = env.max_episode_length, sum(env.ship_sizes)
        return (-steps / (steps - hits), 1.0)
    return (-1.0, 1.0)


def score(env_id: str, value: float) -> float:
    """POPGym's normalised score: ``value`` mapped from the env's return range to [0, 1]."""
    low, high = return_range(env_id)
    return (value - low) / (high - low)


def popgym_envs() -> dict[tuple[str, str], str]:
    """(name, level) -> Gymnasium id of every env the installed popgym registers."""
    try:
        import gymnasium as gym
        import popgym  # noqa: F401  (registers its ids)
    except ImportError as err:
        raise SystemExit(
            f"--suite popgym needs the popgym package ({err}): pip install 'rltrans[popgym]'"
        ) from err
    pattern = re.compile(r"popgym-(\w+?)(Easy|Medium|Hard)-v\d+")
    envs = {}
    for env_id in gym.registry:
        match = pattern.fullmatch(env_id)
        if match:
            envs[(match[1], match[2].lower())] = f"popgym:{env_id}"
    return envs


@dataclass
class Result:
    """One finished run: its evaluated return and score, when it first scored 0.9, its speed."""

    env: str  # POPGym's name without the level, e.g. RepeatFirst
    level: str
    kind: str  # popgym (the package's env) | twin (the torch-native one)
    agent: str
    seed: int
    eval_return: float
    score: float
    steps_to_target: int | None
    sps: float
    run_dir: str


@dataclass(frozen=True)
class Cell:
    """One run of the grid."""

    env: str
    level: str
    kind: str
    agent: str
    seed: int

    @property
    def name(self) -> str:
        """The run's folder under --out."""
        twin = "-twin" if self.kind == "twin" else ""
        return f"{self.env}{self.level.title()}{twin}-{self.agent}-s{self.seed}"


def env_overrides(cell: Cell, env_id: str) -> list[str]:
    """The train overrides that pick the cell's env: the Gymnasium id, or the twin's preset.
    Both run with ``agent.horizon=auto``, which fits the twin to its declared time limit and
    the original to the one length its episodes are observed to have: the same number, so the
    same agent (``tests/trainers/test_horizon.py`` checks every twin's preset)."""
    if cell.kind == "popgym":
        return ["env=gym", f"env.id={env_id}"]
    from rltrans.envs.torch_envs import TORCH_ENVS

    twin = TWINS[cell.env]
    preset = TORCH_ENVS[twin].popgym_presets[cell.level]
    kwargs = (f"env.kwargs.{k}={v}" for k, v in preset.items())
    return [f"env={twin}", *kwargs]


def budget(env: str, level: str, args: argparse.Namespace) -> int:
    """The env steps of a run of ``env`` at ``level``: its --env-steps entry, else --steps."""
    return args.env_steps.get(label(env, level), args.steps)


def one_run(cell: Cell, env_id: str, args: argparse.Namespace) -> Result:
    """Train (or resume, or reuse) one run and evaluate its last checkpoint."""
    run = Path(args.out) / cell.name
    done = run / "result.json"
    if done.is_file():
        return Result(**json.loads(done.read_text()))
    steps = budget(cell.env, cell.level, args)
    train = [
        *env_overrides(cell, env_id),
        *AGENTS[cell.agent],
        *args.overrides.get(cell.agent, []),
        f"env.num_envs={args.num_envs}",
        f"seed={cell.seed}",
        f"total_steps={steps}",
        f"device={args.device}",
        f"run_dir={run}",
        f"algo.eval_every={args.eval_every}",
        f"algo.eval_episodes={args.num_envs}",
        "progress=false",
        "torch_threads=1",
    ]
    # The saved config names popgym's module (env.id popgym:...): the suite chose it, so it
    # vouches for it on resume and evaluation, which run no code a file names otherwise.
    trust = ["trust_env_code=true"] if cell.kind == "popgym" else []
    if (run / "checkpoints" / "last.pt").is_file():
        train = ["resume=true", f"run_dir={run}", f"total_steps={steps}", "progress=false", *trust]
    evaluate = [
        *trust,
        f"checkpoint={run}",
        f"episodes={EVAL_EPISODES}",
        f"num_envs={min(EVAL_EPISODES, 2 * args.num_envs)}",
        f"device={args.device}",
        "torch_threads=1",
        "progress=false",
    ]
    trained, scored = train_and_evaluate(run, train, evaluate)
    low, high = return_range(env_id)
    value = float(scored["mean_return"])
    result = Result(
        cell.env,
        cell.level,
        cell.kind,
        cell.agent,
        cell.seed,
        value,
        score(env_id, value),
        steps_to(run, CURVE, low + TARGET * (high - low)),
        float(trained.get("SPS") or 0.0) or logged_sps(run),
        str(run),
    )
    done.write_text(json.dumps(asdict(result)))
    return result


def chance(env_id: str, seed: int = 0) -> float:
    """The uniform random policy's mean return over CHANCE_EPISODES episodes of ``env_id``."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.action_space.seed(seed)
    returns = []
    for episode in range(CHANCE_EPISODES):
        env.reset(seed=seed + episode)
        total, over = 0.0, False
        while not over:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(reward)
            over = terminated or truncated
        returns.append(total)
    env.close()
    return statistics.mean(returns)


def chances(envs: dict[tuple[str, str], str], out: Path) -> dict[str, float]:
    """Chance's score per env id, measured once and kept in ``out/chance.json``."""
    path = out / "chance.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    for env_id in envs.values():
        if env_id not in known:
            known[env_id] = score(env_id, chance(env_id))
    path.write_text(json.dumps(known, indent=1, sort_keys=True))
    return known


def label(env: str, level: str, kind: str = "popgym") -> str:
    """An env's row name: RepeatFirstMedium, or RepeatFirstMedium (twin)."""
    return f"{env}{level.title()}" + (" (twin)" if kind == "twin" else "")


def table(
    results: list[Result],
    rows: list[tuple[str, str, str]],
    agents: list[str],
    chance_of: dict[tuple[str, str], float],
    budgets: dict[str, int],
) -> str:
    """The markdown table per env and agent (``budgets``: env steps by env label), then each
    level's mean and head-to-head count."""
    lines = [
        "| env | agent | env steps | score (mean, min-max over seeds) | chance "
        f"| steps to {TARGET} | SPS |",
        "|---|---|---|---|---|---|---|",
    ]
    for env, level, kind in rows:
        for agent in agents:
            mine = [
                r for r in results if (r.env, r.level, r.kind, r.agent) == (env, level, kind, agent)
            ]
            if not mine:
                continue
            scores = [r.score for r in mine]
            reached = [r.steps_to_target for r in mine if r.steps_to_target is not None]
            first = (
                f"{statistics.median(reached) / 1000:.0f}k ({len(reached)}/{len(mine)})"
                if reached
                else f"never (0/{len(mine)})"
            )
            lines.append(
                f"| {label(env, level, kind)} | {agent} | {budgets[label(env, level)]:,} "
                f"| {statistics.mean(scores):.2f} ({min(scores):.2f}-{max(scores):.2f}) "
                f"| {chance_of.get((env, level), float('nan')):.2f} | {first} "
                f"| {statistics.mean(r.sps for r in mine):,.0f} |"
            )
    lines += ["", summary(results, agents, chance_of)]
    return "\n".join(lines)


def mean_scores(results: list[Result]) -> dict[tuple[str, str, str], float]:
    """(env, level, agent) -> the mean score over seeds, POPGym's envs only."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in results:
        if r.kind == "popgym":
            groups.setdefault((r.env, r.level, r.agent), []).append(r.score)
    return {key: statistics.mean(values) for key, values in groups.items()}


def summary(results: list[Result], agents: list[str], chance_of: dict) -> str:
    """Per level: each agent's mean score over the envs every agent ran, and on how many of
    the envs where some agent is above chance each agent scores highest."""
    means = mean_scores(results)
    lines = [
        "| level | envs | "
        + " | ".join(f"{a}: mean score" for a in agents)
        + " | envs above chance | "
        + " | ".join(f"{a} ahead" for a in agents)
        + " |",
        "|---|---|" + "---|" * (2 * len(agents) + 1),
    ]
    for level in LEVELS:
        envs = sorted(
            {e for e, lv, _ in means if lv == level and all((e, lv, a) in means for a in agents)}
        )
        if not envs:
            continue
        mean_of = {a: statistics.mean(means[(e, level, a)] for e in envs) for a in agents}
        above = [
            e
            for e in envs
            if max(means[(e, level, a)] for a in agents)
            > chance_of.get((e, level), 0.0) + ABOVE_CHANCE
        ]
        ahead = {
            a: sum(
                means[(e, level, a)]
                > max((means[(e, level, b)] for b in agents if b != a), default=float("-inf"))
                for e in above
            )
            for a in agents
        }
        lines.append(
            f"| {level} | {len(envs)} | "
            + " | ".join(f"{mean_of[a]:.3f}" for a in agents)
            + f" | {len(above)} | "
            + " | ".join(f"{ahead[a]}" for a in agents)
            + " |"
        )
    return "\n".join(lines)


def draw(
    results: list[Result],
    rows: list[tuple[str, str, str]],
    agents: list[str],
    chance_of: dict[tuple[str, str], float],
    ids: dict[tuple[str, str], str],
    out: Path,
) -> None:
    """bars.png (final score per env and agent) and curves.png (score during training)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rltrans.plot import mean_band, read_curve

    colours = {a: f"C{i}" for i, a in enumerate(agents)}
    names = [label(*row) for row in rows]
    fig = Figure(figsize=(max(6.0, 0.55 * len(rows) * len(agents)), 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / len(agents)
    for i, agent in enumerate(agents):
        for x, (env, level, kind) in enumerate(rows):
            scores = [
                r.score
                for r in results
                if (r.env, r.level, r.kind, r.agent) == (env, level, kind, agent)
            ]
            if not scores:
                continue
            at = x - 0.4 + width * (i + 0.5)
            mean = statistics.mean(scores)
            ax.bar(at, mean, width, color=colours[agent], label=agent if x == 0 else None)
            ax.vlines(at, min(scores), max(scores), color="black", linewidth=1)
    for x, (env, level, _) in enumerate(rows):
        if (env, level) in chance_of:
            ax.hlines(chance_of[(env, level)], x - 0.45, x + 0.45, color="grey", linestyle=":")
    ax.set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize="x-small")
    ax.set_ylim(0, 1)
    ax.set_ylabel(f"score ({EVAL_EPISODES} evaluated episodes)", fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(agents), fontsize="small")
    fig.suptitle("mean over seeds, bar: range of seeds, dotted: chance", fontsize="small")
    fig.savefig(out / "bars.png", dpi=110)

    fig, axes = curves_figure(names, {a: colours[a] for a in agents})
    for ax, (env, level, kind) in zip(axes, rows, strict=True):
        low, high = return_range(ids[(env, level)])
        for agent in agents:
            runs = [
                Path(r.run_dir)
                for r in results
                if (r.env, r.level, r.kind, r.agent) == (env, level, kind, agent)
            ]
            if not runs:
                continue
            group = mean_band(agent, [read_curve(r, CURVE, "step") for r in runs])
            low_band, high_band = (
                np.clip((v - low) / (high - low), 0, 1) for v in (group.low, group.high)
            )
            ax.plot(group.x, (group.mean - low) / (high - low), color=colours[agent], label=agent)
            ax.fill_between(
                group.x, low_band, high_band, color=colours[agent], alpha=0.2, linewidth=0
            )
    fig.savefig(out / "curves.png", dpi=CURVES_DPI)


def curves_figure(names: list[str], colours: dict[str, str]) -> tuple[Figure, list[Axes]]:
    """The empty curves figure: a panel per name, CURVES_COLUMNS to a row, its legend (the
    agents' colours) and titles, sized so that shown at DOCS_WIDTH_PX its text stays legible."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    columns = min(CURVES_COLUMNS, len(names))
    lines_of = -(-len(names) // columns)
    # at least wide enough for the title, when there is only one panel
    size = (max(5.4, PANEL_INCHES[0] * columns), PANEL_INCHES[1] * lines_of + 0.8)
    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(lines_of, columns, squeeze=False, sharey=True).ravel())
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    steps = FuncFormatter(lambda value, _: f"{value / 1000:g}k" if value else "0")
    for i, (ax, name) in enumerate(zip(axes, names, strict=False)):
        ax.set_title(name, fontsize=CURVES_FONT + 1)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.xaxis.set_major_formatter(steps)
        ax.tick_params(labelsize=CURVES_FONT)
        ax.set_xlabel("env steps", fontsize=CURVES_FONT)
        if i % columns == 0:
            ax.set_ylabel("score", fontsize=CURVES_FONT)
    handles = [Line2D([], [], color=colour) for colour in colours.values()]
    fig.legend(
        handles, list(colours), loc="outside lower center", ncols=len(colours), fontsize=CURVES_FONT
    )
    fig.suptitle(
        "score of the evaluations during training: mean and 95 % band over seeds",
        fontsize=CURVES_FONT + 1,
    )
    return fig, axes[: len(names)]


def update_sps(train: list[str], updates: int) -> float:
    """Env steps per second of wall time of one run of ``train`` in this process: the steps of
    one update over the median time between its log lines, over ``updates`` updates after the
    first (the median passes over an update that compiled)."""
    import rltrans

    stamps: list[tuple[int, float]] = []

    def mark(step: int, metrics: dict) -> bool:
        stamps.append((step, time.perf_counter()))
        return len(stamps) <= updates  # False after the last: the run stops there

    rltrans.learn(rltrans.plan(*train), on_log=mark)
    gaps = [(s1 - s0) / (t1 - t0) for (s0, t0), (s1, t1) in itertools.pairwise(stamps)]
    return statistics.median(gaps)


def speed(chosen: dict[tuple[str, str], str], args: argparse.Namespace) -> str:
    """Both agents' SPS over whole PPO updates on each env, measured in this one process with
    the agents' runs alternating over ``--rounds`` rounds (their order flipped each round):
    the median per agent and, per round, each agent's ratio to the first agent's."""
    agents = args.agents
    head = " | ".join(f"{a} SPS (median)" for a in agents)
    ratios = " | ".join(f"{a} / {agents[0]} (median, range)" for a in agents[1:])
    lines = [f"| env | {head} | {ratios} |", "|---" * (2 * len(agents)) + "|"]  # env, SPS, ratios
    for (env, level), env_id in chosen.items():
        sps: dict[str, list[float]] = {a: [] for a in agents}
        for round_ in range(args.rounds):
            for agent in agents if round_ % 2 == 0 else agents[::-1]:
                folder = Path(args.out) / "speed" / f"{label(env, level)}-{agent}-r{round_}"
                train = [
                    "env=gym",
                    f"env.id={env_id}",
                    *AGENTS[agent],
                    *args.overrides.get(agent, []),
                    f"env.num_envs={args.num_envs}",
                    f"total_steps={budget(env, level, args)}",  # compile=auto decides as a run
                    f"device={args.device}",
                    f"run_dir={folder}",
                    "progress=false",
                    "torch_threads=1",
                    "trust_env_code=true",
                ]
                sps[agent].append(update_sps(train, args.updates))
                print(f"# {label(env, level)} {agent} round {round_ + 1}: "
                      f"{sps[agent][-1]:,.0f} SPS", flush=True)  # fmt: skip
        cells = [f"{statistics.median(sps[a]):,.0f}" for a in agents]
        for agent in agents[1:]:
            r = [x / y for x, y in zip(sps[agent], sps[agents[0]], strict=True)]
            cells.append(f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})")
        lines.append(f"| {label(env, level)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def agent_overrides(entries: list[str], agents: list[str]) -> dict[str, list[str]]:
    """--set entries as each agent's train overrides; ValueError naming a bad entry."""
    overrides: dict[str, list[str]] = {agent: [] for agent in agents}
    for entry in entries:
        agent, colon, override = entry.partition(":")
        if not colon or "=" in agent:  # no prefix: a ':' inside the value (a YAML mapping)
            agent, override = "", entry
        if "=" not in override or (agent and agent not in agents):
            raise ValueError(
                f"--set {entry!r}: expected [AGENT:]KEY=VALUE with AGENT one of the agents "
                f"run: {', '.join(agents)}"
            )
        for name in [agent] if agent else agents:
            overrides[name].append(override)
    return overrides


def main(argv: list[str] | None = None) -> None:
    """Run the grid (in parallel, resumably), print the table, write the pictures."""
    p = argparse.ArgumentParser(
        prog="memory_suite.py --suite popgym",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="Easy, one seed, 200k steps (about an hour on 2 cores)"
    )
    p.add_argument("--levels", nargs="+", choices=LEVELS)
    p.add_argument("--envs", nargs="+", metavar="NAME", help="POPGym names, e.g. RepeatFirst")
    p.add_argument("--agents", nargs="+", choices=list(AGENTS), default=list(AGENTS))
    p.add_argument("--seeds", type=int, help="seeds 1..N")
    p.add_argument("--steps", type=int, help="env steps per run")
    p.add_argument(
        "--env-steps",
        nargs="+",
        default=None,
        metavar="NAME=STEPS",
        help="env steps per run of these envs (e.g. CountRecallMedium=3000000)",
    )
    p.add_argument("--twins", action="store_true", help="also each env's torch-native twin")
    p.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="[AGENT:]KEY=VALUE",
        help="train overrides for every run (AGENT: only that agent's), e.g. a candidate\n"
        "default: --set algo.gamma=0.9 gtrxl:agent.long_memory=mixed",
    )
    p.add_argument("--num-envs", type=int, default=NUM_ENVS, help="envs per run")
    p.add_argument("--eval-every", type=int, default=8, help="updates between evaluations")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs at once")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="runs/popgym_suite", help="runs, table and pictures")
    p.add_argument(
        "--speed",
        action="store_true",
        help="instead of the runs: both agents' SPS over whole PPO updates on each env,\n"
        "their runs alternating in this one process (written to speed.md)",
    )
    p.add_argument("--rounds", type=int, default=3, help="--speed: rounds of both agents")
    p.add_argument("--updates", type=int, default=4, help="--speed: timed updates per run")
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else "full"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        args.overrides = agent_overrides(args.set, args.agents)
    except ValueError as error:
        p.error(str(error))
    registered = popgym_envs()
    known = sorted({name for name, _ in registered})
    if args.envs:
        unknown = [e for e in args.envs if e not in known]
        if unknown:
            p.error(f"--envs {' '.join(unknown)}: popgym registers {', '.join(known)}")
    chosen = {
        key: env_id
        for key, env_id in sorted(registered.items())
        if key[1] in args.levels and (not args.envs or key[0] in args.envs)
    }
    if isinstance(args.env_steps, list):
        try:
            names = sorted(label(*k) for k in chosen)
            args.env_steps = named_steps(args.env_steps, names, "--env-steps", "NAME")
        except ValueError as error:
            p.error(str(error))
    if args.speed:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        text = speed(chosen, args)
        print(text)
        (out / "speed.md").write_text(text + "\n")
        return
    kinds = ["popgym", "twin"] if args.twins else ["popgym"]
    rows = [(e, lv, k) for (e, lv) in chosen for k in kinds if k == "popgym" or e in TWINS]
    grid = [
        (Cell(e, lv, k, agent, seed), chosen[(e, lv)])
        for seed in range(1, args.seeds + 1)
        for e, lv, k in rows
        for agent in args.agents
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chance_by_id = chances(chosen, out)
    chance_of = {key: chance_by_id[env_id] for key, env_id in chosen.items()}
    print(f"# {len(grid)} runs in {out}, {args.jobs} at a time", flush=True)
    start = time.monotonic()
    results = run_grid(
        args.jobs,
        {cell.name: partial(one_run, cell, env_id, args) for cell, env_id in grid},
        lambda r: f"score {r.score:.2f} (return {r.eval_return:.2f}), {r.sps:,.0f} SPS",
    )
    for r in results:  # scored by today's ranges, whenever the run was made
        r.score = score(chosen[(r.env, r.level)], r.eval_return)
    budgets = {label(e, lv): budget(e, lv, args) for e, lv in chosen}
    text = table(results, rows, args.agents, chance_of, budgets)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    draw(results, rows, args.agents, chance_of, chosen, out)
    print(
        f"# {(time.monotonic() - start) / 60:.1f} min; pictures: {out / 'bars.png'}, "
        f"{out / 'curves.png'}"
    )


if __name__ == "__main__":
    main()
