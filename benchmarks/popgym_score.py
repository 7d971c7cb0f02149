"""POPGym's scores of benchmarks/popgym_suite.py's runs, and the table and pictures of them.

Both scores map a return onto [0, 1] by the env's least and greatest return (POPGym scales
every env's return into [-1, 1]; the cart-poles pay only for surviving steps, [0, 1]). The
MMER is POPGym's own score (Morad et al. 2023): the best mean return of the last 100 training
episodes at any update, read from the run's logs. The deterministic score is the final
policy's mean return over 100 evaluated episodes. Chance is the uniform random policy's
score, measured once per env.

``table()`` gives both scores per env and agent over the seeds, chance, env steps to a score of
0.9 in the evaluations during training and SPS, then per level each agent's mean scores and
head-to-head count; ``draw()`` writes ``bars.png`` (both scores per env) and ``curves.png``
(the evaluations during training). A module of popgym_suite.py's, with no command line of its
own.
"""

from __future__ import annotations

import functools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LEVELS = ("easy", "medium", "hard")
EVAL_EPISODES = 100
CHANCE_EPISODES = 100
TARGET = 0.9  # the score whose first crossing is reported
ABOVE_CHANCE = 0.05  # a score counts as above chance when it beats chance's by more than this
CURVE = "eval/episodic_return"
# The trainer's mean return of the last <= 100 finished training episodes, logged every update.
TRAIN_CURVE = "charts/episodic_return"
MMER_LABEL = "MMER (POPGym's score: best 100-episode training mean)"
DETERMINISTIC_LABEL = f"deterministic score (final policy, {EVAL_EPISODES} evaluated episodes)"
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
    """``value`` (a return) mapped from the env's return range onto [0, 1], for both scores:
    POPGym's 0.5 x + 0.5 where the range is [-1, 1], the return itself on a cart-pole."""
    low, high = return_range(env_id)
    return (value - low) / (high - low)


def mmer(run: Path) -> float | None:
    """A run's MMER, POPGym's "max mean episodic reward" (Morad et al. 2023), unnormalised: the
    greatest value over training of ``charts/episodic_return``, which the trainer logs at the
    end of every PPO update as the mean return of the last <= 100 finished training episodes
    (actions sampled, as in training), fewer while fewer have finished. None where the run
    logged no such value (no TensorBoard events, or no episode finished).

    POPGym maximises RLlib's ``episode_reward_mean`` over its training iterations. That is the
    same window, with one difference: an iteration that finishes more than 100 episodes is
    averaged over all of them. The run logs only the window's mean, so an update that finishes
    more than 100 episodes counts its last 100 here (exact otherwise). The maximum is also
    taken more often: after every update (``env.num_envs`` x the rollout: 2,048 steps or more
    at the suite's 16 envs), where POPGym's baselines report every 65,536 steps; more samples
    of a noisy mean can only raise its maximum."""
    from rltrans.plot import PlotError, read_curve

    try:
        means = read_curve(run, TRAIN_CURVE, "step").y
    except PlotError:
        return None
    return float(np.max(means)) if len(means) else None


@dataclass
class Result:
    """One finished run: its evaluated return and score, when it first scored 0.9, its speed,
    its MMER and the MMER's score (None in a result written before the suite kept them, and
    then read from the run's logs where they are)."""

    env: str  # POPGym's name without the level, e.g. RepeatFirst
    level: str
    kind: str  # popgym (the package's env) | twin (the torch-native one)
    agent: str
    seed: int
    eval_return: float  # the final policy's mean return over EVAL_EPISODES deterministic ones
    score: float  # ... normalised: the deterministic score
    steps_to_target: int | None
    sps: float
    run_dir: str
    mmer: float | None = None  # the best 100-episode training mean return (see mmer())
    mmer_score: float | None = None  # ... normalised as the score is


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
    """The markdown table per env and agent (``budgets``: env steps by env label), both scores
    side by side, then each level's mean and head-to-head count."""
    lines = [
        f"| env | agent | env steps | {DETERMINISTIC_LABEL}: mean (min-max over seeds) "
        f"| {MMER_LABEL}: mean (min-max) | chance "
        f"| steps to {TARGET} (evaluations during training) | SPS |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for env, level, kind in rows:
        for agent in agents:
            mine = [
                r for r in results if (r.env, r.level, r.kind, r.agent) == (env, level, kind, agent)
            ]
            if not mine:
                continue
            best = [r.mmer_score for r in mine if r.mmer_score is not None]
            # a run without the MMER (an older result whose logs are gone) is left out of it
            partly = f" [{len(best)} of {len(mine)} seeds]" if 0 < len(best) < len(mine) else ""
            reached = [r.steps_to_target for r in mine if r.steps_to_target is not None]
            first = (
                f"{statistics.median(reached) / 1000:.0f}k ({len(reached)}/{len(mine)})"
                if reached
                else f"never (0/{len(mine)})"
            )
            lines.append(
                f"| {label(env, level, kind)} | {agent} | {budgets[label(env, level)]:,} "
                f"| {spread([r.score for r in mine])} | {spread(best)}{partly} "
                f"| {chance_of.get((env, level), float('nan')):.2f} | {first} "
                f"| {statistics.mean(r.sps for r in mine):,.0f} |"
            )
    legend = (
        f"{MMER_LABEL} and {DETERMINISTIC_LABEL}: both mapped onto [0, 1] by the env's return "
        "range; chance: the uniform random policy's score; above chance: some agent beats chance's "
        f"score by more than {ABOVE_CHANCE}; ahead: the highest mean; both counted by each score "
        "(det / MMER: - where a run has no MMER)."
    )
    lines += ["", summary(results, agents, chance_of), "", legend]
    return "\n".join(lines)


def spread(values: list[float]) -> str:
    """``mean (min-max)`` of scores, or - where there are none."""
    if not values:
        return "-"
    return f"{statistics.mean(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def mean_scores(results: list[Result], key: str = "score") -> dict[tuple[str, str, str], float]:
    """(env, level, agent) -> the mean over seeds of the score ``key`` (score, or mmer_score:
    the seeds that have one), POPGym's envs only."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for r in results:
        if r.kind == "popgym" and getattr(r, key) is not None:
            groups.setdefault((r.env, r.level, r.agent), []).append(getattr(r, key))
    return {key: statistics.mean(values) for key, values in groups.items()}


def summary(results: list[Result], agents: list[str], chance_of: dict) -> str:
    """Per level: each agent's mean deterministic score and mean MMER score over the envs every
    agent ran (- where an env has no MMER), and by each score, on how many envs some agent is
    above chance and on how many of those each agent scores highest (``det / MMER``)."""
    means, best = mean_scores(results), mean_scores(results, "mmer_score")
    heads = [f"{a}: deterministic score" for a in agents] + [f"{a}: MMER" for a in agents]
    lines = [
        "| level | envs | "
        + " | ".join(heads)
        + " | envs above chance (det / MMER) | "
        + " | ".join(f"{a} ahead (det / MMER)" for a in agents)
        + " |",
        "|---|---|" + "---|" * (3 * len(agents) + 1),
    ]
    for level in LEVELS:
        envs = sorted(
            {e for e, lv, _ in means if lv == level and all((e, lv, a) in means for a in agents)}
        )
        if not envs:
            continue
        cells = [f"{statistics.mean(means[(e, level, a)] for e in envs):.3f}" for a in agents]
        have = all((e, level, a) in best for e in envs for a in agents)
        for a in agents:
            known = all((e, level, a) in best for e in envs)
            cells.append(
                f"{statistics.mean(best[(e, level, a)] for e in envs):.3f}" if known else "-"
            )
        above, ahead = head_to_head(means, envs, level, agents, chance_of)
        by_mmer = head_to_head(best, envs, level, agents, chance_of) if have else None
        above_m = "-" if by_mmer is None else len(by_mmer[0])
        counts = [f"{ahead[a]} / {'-' if by_mmer is None else by_mmer[1][a]}" for a in agents]
        lines.append(
            f"| {level} | {len(envs)} | "
            + " | ".join(cells)
            + f" | {len(above)} / {above_m} | "
            + " | ".join(counts)
            + " |"
        )
    return "\n".join(lines)


def head_to_head(
    means: dict[tuple[str, str, str], float],
    envs: list[str],
    level: str,
    agents: list[str],
    chance_of: dict,
) -> tuple[list[str], dict[str, int]]:
    """The envs of ``level`` where some agent's mean score beats chance by ABOVE_CHANCE, and on
    how many of them each agent scores highest."""
    above = [
        e
        for e in envs
        if max(means[(e, level, a)] for a in agents) > chance_of.get((e, level), 0.0) + ABOVE_CHANCE
    ]
    ahead = {
        a: sum(
            means[(e, level, a)]
            > max((means[(e, level, b)] for b in agents if b != a), default=float("-inf"))
            for e in above
        )
        for a in agents
    }
    return above, ahead


def draw(
    results: list[Result],
    rows: list[tuple[str, str, str]],
    agents: list[str],
    chance_of: dict[tuple[str, str], float],
    ids: dict[tuple[str, str], str],
    out: Path,
) -> None:
    """bars.png (both scores per env and agent) and curves.png (score during training)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from rltrans.plot import mean_band, read_curve

    colours = {a: f"C{i}" for i, a in enumerate(agents)}
    names = [label(*row) for row in rows]
    fig = Figure(figsize=(max(6.0, 0.55 * len(rows) * len(agents)), 6.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 1, sharex=True)
    for ax, key, title in zip(
        axes, ("score", "mmer_score"), (DETERMINISTIC_LABEL, MMER_LABEL), strict=True
    ):
        bar_panel(ax, results, rows, colours, key, chance_of)
        ax.set_title(title, fontsize="small")
    axes[-1].set_xticks(range(len(rows)), names, rotation=60, ha="right", fontsize="x-small")
    handles, labels = axes[0].get_legend_handles_labels()
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


def bar_panel(
    ax: Axes,
    results: list[Result],
    rows: list[tuple[str, str, str]],
    colours: dict[str, str],
    key: str,
    chance_of: dict[tuple[str, str], float],
) -> None:
    """One panel of bars.png: the score ``key`` of each row (a bar per agent in ``colours``,
    the mean over seeds, the seeds' range as a line, chance dotted); a run without one is
    left out."""
    width = 0.8 / len(colours)
    for i, (agent, colour) in enumerate(colours.items()):
        for x, (env, level, kind) in enumerate(rows):
            scores = [
                getattr(r, key)
                for r in results
                if (r.env, r.level, r.kind, r.agent) == (env, level, kind, agent)
                and getattr(r, key) is not None
            ]
            if not scores:
                continue
            at = x - 0.4 + width * (i + 0.5)
            ax.bar(
                at, statistics.mean(scores), width, color=colour, label=agent if x == 0 else None
            )
            ax.vlines(at, min(scores), max(scores), color="black", linewidth=1)
    for x, (env, level, _) in enumerate(rows):
        if (env, level) in chance_of:
            ax.hlines(chance_of[(env, level)], x - 0.45, x + 0.45, color="grey", linestyle=":")
    ax.set_ylim(0, 1)
    ax.set_ylabel("score", fontsize="small")
    ax.grid(axis="y", alpha=0.3)


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
