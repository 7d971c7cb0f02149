r"""POPGym's own envs, run the way a user runs a Gymnasium env: two scores per env and agent.

Every run is ``python -m rltrans.train env=gym env.id=popgym:popgym-<Name><Level>-v0
agent=<agent>`` with nothing else but the seed, the budget and logging (the agents' defaults,
no memory flag), then ``python -m rltrans.evaluate`` over 100 deterministic episodes of its last
checkpoint, both in one process per run. Runs go to parallel processes (``--jobs``) and to
folders of their own under ``--out``; a finished run is not done again and an interrupted one
resumes from its checkpoint, so the suite can be stopped and started at will.

Both scores map a return onto [0, 1] by the env's least and greatest return (POPGym scales
every env's return into [-1, 1]; the cart-poles pay only for surviving steps, [0, 1]). The
MMER is POPGym's own score (Morad et al. 2023): the best mean return of the last 100 training
episodes at any update, read from the run's logs. The deterministic score is the final
policy's mean return over 100 evaluated episodes. Chance is the uniform random policy's
score. ``--twins`` also runs the torch-native twin of every env that has one at the same
preset, agents and seeds. ``--set`` adds train overrides to every run (``AGENT:`` for one
agent's; give each setting an ``--out`` of its own: a finished run is reused, whatever
``--set`` says now).

Written to ``--out``: ``table.md`` (both scores per env and agent over the seeds, chance,
env steps to a score of 0.9 in the evaluations during training, SPS; per level each agent's
mean scores and leads by each score), ``results.json``, ``bars.png`` (both scores per env)
and ``curves.png`` (the evaluations during training). ``--collect DIR ...`` trains none: it
tables the finished runs under earlier ``--out`` folders. ``--speed`` runs no grid: it times
both agents' whole PPO updates on each env over ``--rounds`` rounds (``speed.md``).

    python benchmarks/memory_suite.py --suite popgym --quick    # 28 runs, about an hour on 2 cores
    python benchmarks/memory_suite.py --suite popgym            # Easy and Medium, seeds 1-3
    python benchmarks/memory_suite.py --suite popgym --levels medium \
        --envs RepeatFirst CountRecall --seed 2 --twins --jobs 2
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from common import logged_sps, named_steps, run_grid, steps_to, train_and_evaluate
from popgym_score import (
    CURVE,
    EVAL_EPISODES,
    LEVELS,
    TARGET,
    Result,
    chances,
    draw,
    label,
    mmer,
    return_range,
    score,
    table,
)

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


def finished(run: Path, env_id: str) -> Result:
    """The result a finished run folder keeps; an older one without the MMER gets it from the
    run's logs (where they are), written back so it is read once."""
    done = run / "result.json"
    result = Result(**json.loads(done.read_text()))
    if result.mmer is None and (best := mmer(run)) is not None:
        result.mmer, result.mmer_score = best, score(env_id, best)
        done.write_text(json.dumps(asdict(result)))
    return result


def one_run(cell: Cell, env_id: str, args: argparse.Namespace) -> Result:
    """Train (or resume, or reuse) one run and evaluate its last checkpoint."""
    run = Path(args.out) / cell.name
    if (run / "result.json").is_file():
        return finished(run, env_id)
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
    value, best = float(scored["mean_return"]), mmer(run)
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
        best,
        None if best is None else score(env_id, best),
    )
    (run / "result.json").write_text(json.dumps(asdict(result)))
    return result


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


def parser() -> argparse.ArgumentParser:
    """The suite's command line (its help: the module's docstring)."""
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
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, metavar="N", help="seeds 1..N")
    seeds.add_argument("--seed", type=int, metavar="N", help="seed N alone (not with --seeds)")
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
    p.add_argument(
        "--collect",
        nargs="+",
        metavar="DIR",
        help="instead of the runs: the table and pictures of the finished runs under these\n"
        "folders (earlier suites' --out), written to --out; trains none",
    )
    p.add_argument("--rounds", type=int, default=3, help="--speed: rounds of both agents")
    p.add_argument("--updates", type=int, default=4, help="--speed: timed updates per run")
    return p


def parse(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    """The parser and its reading of ``argv``: the preset's value of every option left unset,
    ``seed_list`` (the seeds to run: --seed's one, else 1..--seeds) and ``overrides`` (each
    agent's --set entries). Exits with code 2 naming a bad option."""
    p = parser()
    args = p.parse_args(argv)
    preset = PRESETS["quick" if args.quick else "full"]
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.seed is not None and args.seed < 0:
        p.error(f"--seed {args.seed}: expected a seed >= 0")
    args.seed_list = [args.seed] if args.seed is not None else list(range(1, args.seeds + 1))
    try:
        args.overrides = agent_overrides(args.set, args.agents)
    except ValueError as error:
        p.error(str(error))
    return p, args


def chosen_envs(p: argparse.ArgumentParser, args: argparse.Namespace) -> dict[tuple[str, str], str]:
    """(name, level) -> Gymnasium id of the envs ``args`` chose; reads --env-steps against them.
    Exits with code 2 naming an env popgym does not register, or a bad --env-steps entry."""
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
    return chosen


def progress(r: Result) -> str:
    """A finished run's progress line."""
    best = "-" if r.mmer_score is None else f"{r.mmer_score:.2f}"
    det = f"deterministic score {r.score:.2f} (return {r.eval_return:.2f})"
    return f"{det}, MMER {best}, {r.sps:,.0f} SPS"


def main(argv: list[str] | None = None) -> None:
    """Run the grid (in parallel, resumably), print the table, write the pictures."""
    p, args = parse(argv)
    chosen, out = chosen_envs(p, args), Path(args.out)
    if args.speed:
        out.mkdir(parents=True, exist_ok=True)
        text = speed(chosen, args)
        print(text)
        (out / "speed.md").write_text(text + "\n")
        return
    if args.collect:
        report(*collected(p, args.collect), out)
        return
    kinds = ["popgym", "twin"] if args.twins else ["popgym"]
    rows = [(e, lv, k) for (e, lv) in chosen for k in kinds if k == "popgym" or e in TWINS]
    grid = [
        (Cell(e, lv, k, agent, seed), chosen[(e, lv)])
        for seed in args.seed_list
        for e, lv, k in rows
        for agent in args.agents
    ]
    out.mkdir(parents=True, exist_ok=True)
    print(f"# {len(grid)} runs in {out}, {args.jobs} at a time", flush=True)
    start = time.monotonic()
    results = run_grid(
        args.jobs,
        {cell.name: partial(one_run, cell, env_id, args) for cell, env_id in grid},
        progress,
    )
    budgets = {label(e, lv): budget(e, lv, args) for e, lv in chosen}
    report(results, chosen, budgets, out)
    print(f"# {(time.monotonic() - start) / 60:.1f} min")


def row_order(row: tuple[str, str, str]) -> tuple[int, str, str]:
    """A table row's place: by level (Easy first), then env, then the twin after its env."""
    env, level, kind = row
    return (LEVELS.index(level), env, kind)


def collected(
    p: argparse.ArgumentParser, folders: list[str]
) -> tuple[list[Result], dict[tuple[str, str], str], dict[str, int]]:
    """The finished runs (``result.json``, one folder down) under ``folders``, the env ids they
    ran and each env's budget (its runs' ``total_steps``); an older result gets its MMER from its
    logs, as a suite run reuses it. Names the unfinished runs it leaves out; exits with code 2
    naming a run found twice, or where no folder holds a finished run."""
    registered = popgym_envs()
    found: dict[str, Path] = {}
    results, budgets, unfinished = [], {}, []
    for folder in folders:
        for run in sorted(path.parent for path in Path(folder).glob("*/config.yaml")):
            if not (run / "result.json").is_file():
                unfinished.append(run.name)
                continue
            if run.name in found:
                p.error(f"--collect: the run {run.name} is in both {found[run.name]} and {run}")
            found[run.name] = run
            kept = json.loads((run / "result.json").read_text())
            result = finished(run, registered[(kept["env"], kept["level"])])
            result.run_dir = str(run)  # where it is now: its curves are read from it
            results.append(result)
            key = label(result.env, result.level)
            budgets[key] = max(budgets.get(key, 0), run_steps(run))
    if not results:
        p.error(f"--collect {' '.join(folders)}: no finished run (no */result.json) in them")
    if unfinished:
        print(f"# {len(unfinished)} unfinished runs left out: {', '.join(unfinished)}")
    chosen = {(r.env, r.level): registered[(r.env, r.level)] for r in results}
    return results, chosen, budgets


def run_steps(run: Path) -> int:
    """The env steps a finished run was given: ``total_steps`` of its saved config."""
    from rltrans.config import read_yaml

    return int(read_yaml(run / "config.yaml")["total_steps"])


def report(
    results: list[Result], chosen: dict[tuple[str, str], str], budgets: dict[str, int], out: Path
) -> None:
    """Score ``results`` by today's return ranges and write the table (also printed),
    ``results.json`` and the pictures to ``out``: a row per env they ran (by level, then
    name, each twin after its env), the agents in the suite's order."""
    rows = sorted({(r.env, r.level, r.kind) for r in results}, key=row_order)
    agents = [a for a in AGENTS if any(r.agent == a for r in results)]
    out.mkdir(parents=True, exist_ok=True)
    chance_by_id = chances(chosen, out)
    chance_of = {key: chance_by_id[env_id] for key, env_id in chosen.items()}
    for r in results:  # scored by today's ranges, whenever the run was made
        env_id = chosen[(r.env, r.level)]
        r.score = score(env_id, r.eval_return)
        r.mmer_score = None if r.mmer is None else score(env_id, r.mmer)
    text = table(results, rows, agents, chance_of, budgets)
    print(text)
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    draw(results, rows, agents, chance_of, chosen, out)
    print(f"# table: {out / 'table.md'}; pictures: {out / 'bars.png'}, {out / 'curves.png'}")


if __name__ == "__main__":
    main()
