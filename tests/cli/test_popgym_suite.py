"""benchmarks/memory_suite.py --suite popgym on a tiny grid of POPGym's own envs: the table, the
level summary, both pictures, chance, the twins, and a second call that trains nothing."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.scripts import benchmark_script

pytest.importorskip("popgym")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "memory_suite.py"


@pytest.fixture(scope="module")
def scoring():
    """benchmarks/popgym_score.py: the scores, the table and the pictures."""
    with benchmark_script("popgym_score") as module:
        yield module


@pytest.fixture(scope="module")
def suite(scoring):
    """benchmarks/popgym_suite.py, importing the scoring module above: one Result class."""
    with benchmark_script("popgym_suite") as module:
        yield module


def run_suite(out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["--suite", "popgym", "--levels", "easy", "--envs", "RepeatFirst", "MultiarmedBandit"]
    args += ["--agents", "gru", "--seeds", "1", "--steps", "1024", "--num-envs", "4"]
    args += ["--eval-every", "1", "--jobs", "2", "--out", str(out), *extra]
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )


def test_the_popgym_suite_scores_each_env_by_its_gymnasium_id_and_reuses_finished_runs(tmp_path):
    out = tmp_path / "suite"
    extra = ["--twins", "--env-steps", "RepeatFirstEasy=2048", "--set", "algo.gamma=0.9"]
    extra += ["gru:algo.ent_coef=0.02"]
    first = run_suite(out, *extra)
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    cells = {(r["env"], r["kind"]) for r in results}
    # RepeatFirst has a torch-native twin, the bandit has none
    assert cells == {
        ("RepeatFirst", "popgym"),
        ("RepeatFirst", "twin"),
        ("MultiarmedBandit", "popgym"),
    }
    for r in results:
        assert r["score"] == pytest.approx((r["eval_return"] + 1) / 2)
        config = (Path(r["run_dir"]) / "config.yaml").read_text()
        if r["kind"] == "popgym":  # the user's path: the Gymnasium id, the agent's defaults
            assert f"id: popgym:popgym-{r['env']}Easy-v0\n" in config
        else:
            assert "name: repeat_first\n" in config
        budget = 2048 if r["env"] == "RepeatFirst" else 1024
        assert f"total_steps: {budget}\n" in config
        assert "gamma: 0.9\n" in config and "ent_coef: 0.02\n" in config  # --set
    chance = json.loads((out / "chance.json").read_text())
    assert set(chance) == {
        "popgym:popgym-RepeatFirstEasy-v0",
        "popgym:popgym-MultiarmedBanditEasy-v0",
    }
    # a random answer among 4 cards is right a quarter of the time: return -0.5, score 0.25
    assert chance["popgym:popgym-RepeatFirstEasy-v0"] == pytest.approx(0.25, abs=0.05)
    table = (out / "table.md").read_text()
    assert "| RepeatFirstEasy (twin) | gru | 2,048 |" in table
    assert "| MultiarmedBanditEasy | gru | 1,024 |" in table
    level = next(line for line in table.splitlines() if line.startswith("| easy |"))
    popgym_scores = [r["score"] for r in results if r["kind"] == "popgym"]
    assert level.split(" | ")[1:3] == ["2", f"{sum(popgym_scores) / 2:.3f}"]
    for picture in ("bars.png", "curves.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoints/last.pt")}
    again = run_suite(out, *extra)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/checkpoints/last.pt")} == stamps


def test_the_popgym_suite_names_what_it_refuses(tmp_path):
    bad_env = run_suite(tmp_path / "a", "--envs", "RepeatFirst", "Tetris")
    assert bad_env.returncode == 2
    assert "--envs Tetris: popgym registers" in bad_env.stderr and "CountRecall" in bad_env.stderr
    bad_steps = run_suite(tmp_path / "b", "--env-steps", "RepeatFirstHard=10")
    assert bad_steps.returncode == 2
    assert "--env-steps 'RepeatFirstHard=10'" in bad_steps.stderr
    assert "RepeatFirstEasy" in bad_steps.stderr
    bad_set = run_suite(tmp_path / "c", "--set", "lstm:algo.gamma=0.9")
    assert bad_set.returncode == 2
    assert "--set 'lstm:algo.gamma=0.9': expected [AGENT:]KEY=VALUE" in bad_set.stderr


def test_scores_map_each_envs_return_range_onto_zero_to_one(scoring):
    first = "popgym:popgym-RepeatFirstEasy-v0"
    assert scoring.score(first, -1.0) == 0.0 and scoring.score(first, 1.0) == 1.0
    assert scoring.score("popgym:popgym-CountRecallMedium-v0", 0.0) == 0.5
    # the cart-poles pay only for surviving steps: their returns lie in [0, 1]
    assert scoring.score("popgym:popgym-PositionOnlyCartPoleEasy-v0", 0.5) == 0.5
    assert scoring.score("popgym:popgym-VelocityOnlyCartpoleMedium-v0", 1.0) == 1.0
    # Battleship Easy: 64 shots, 12 hits sink every ship; all misses pay -64 / 52
    low, high = scoring.return_range("popgym:popgym-BattleshipEasy-v0")
    assert (low, high) == (pytest.approx(-64 / 52), 1.0)
    assert scoring.score("popgym:popgym-BattleshipEasy-v0", low) == 0.0


def test_every_registered_popgym_env_is_in_the_suite_at_each_level(scoring, suite):
    envs = suite.popgym_envs()
    names = {name for name, _ in envs}
    assert {"RepeatFirst", "CountRecall", "Autoencode", "MineSweeper"} <= names
    assert all((name, level) in envs for name in names for level in scoring.LEVELS)
    assert envs[("RepeatFirst", "medium")] == "popgym:popgym-RepeatFirstMedium-v0"
    assert set(suite.TWINS) <= names


def test_the_level_summary_counts_a_lone_agent_ahead_where_it_beats_chance(scoring):
    results = [
        scoring.Result(env, "medium", "popgym", "gtrxl", 1, 0.0, score, None, 1.0, "")
        for env, score in (("RepeatFirst", 1.0), ("CountRecall", 0.02))
    ]
    chance = {("RepeatFirst", "medium"): 0.25, ("CountRecall", "medium"): 0.03}
    head, *_, line = scoring.summary(results, ["gtrxl"], chance).splitlines()
    assert head == (
        "| level | envs | gtrxl: deterministic score | gtrxl: MMER "
        "| envs above chance (det / MMER) | gtrxl ahead (det / MMER) |"
    )
    # one env above chance (RepeatFirst's 1.0 against 0.25), and it leads there; no MMER: "-"
    assert line == "| medium | 2 | 0.510 | - | 1 / - | 1 / - |"


def test_a_set_value_holding_a_colon_is_not_read_as_an_agent_prefix(suite):
    wrappers = "env.wrappers=[{path: gymnasium.wrappers.FlattenObservation}]"
    sets = suite.agent_overrides([wrappers, "gru:algo.gamma=0.5"], ["gtrxl", "gru"])
    assert sets == {"gtrxl": [wrappers], "gru": [wrappers, "algo.gamma=0.5"]}


def test_speed_times_both_agents_runs_alternating_in_one_process(tmp_path):
    """--speed trains no grid: each agent's short runs stop after the timed updates, and
    speed.md gives each agent's median SPS and the ratio per round."""
    out = tmp_path / "speed"
    args = ["--suite", "popgym", "--speed", "--levels", "easy", "--envs", "RepeatFirst"]
    args += ["--rounds", "2", "--updates", "2", "--num-envs", "2", "--steps", "4096"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rounds = [line for line in done.stdout.splitlines() if line.startswith("# RepeatFirstEasy")]
    assert [line.split(" SPS")[0].split(":")[0] for line in rounds] == [
        "# RepeatFirstEasy gtrxl round 1",
        "# RepeatFirstEasy gru round 1",
        "# RepeatFirstEasy gru round 2",  # the order flips each round
        "# RepeatFirstEasy gtrxl round 2",
    ]
    sps = {}
    for line in rounds:
        name = line.split()[2]
        sps.setdefault(name, []).append(float(line.split(": ")[1].split()[0].replace(",", "")))
    row = (out / "speed.md").read_text().splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    ratios = sorted(g / t for g, t in zip(sps["gru"], sps["gtrxl"], strict=True))
    assert cells[0] == "RepeatFirstEasy"
    assert float(cells[2].replace(",", "")) == pytest.approx(statistics.median(sps["gru"]), abs=1)
    median, spread = cells[3].split(" ", 1)
    low, high = spread.strip("()").split("-")
    # The printed SPS are whole numbers: at a few tens of SPS (a loaded machine) their
    # rounding moves a ratio by more than its own 2-decimal print does.
    pairs = zip(sps["gru"], sps["gtrxl"], strict=True)
    slack = 0.006 + max(g / t * (0.5 / g + 0.5 / t) for g, t in pairs)
    assert float(median) == pytest.approx(sum(ratios) / 2, abs=slack)
    assert (float(low), float(high)) == pytest.approx(ratios, abs=slack)
    stops = (done.stdout + done.stderr).count("on_log returned False: training stopped at step")
    assert stops == 4  # each run stopped after its timed updates, long before its budget
    for run in (out / "speed").iterdir():
        assert "total_steps: 4096" in (run / "config.yaml").read_text()  # compile=auto's view


def _drawn_texts(fig) -> list:
    """The text a drawn figure shows: every visible, non-empty Text, of the tick labels only
    those inside their axis's view (matplotlib keeps spare ticks it does not draw)."""
    from matplotlib.text import Text

    fig.draw_without_rendering()
    shown, tick_labels = set(), set()
    for ax in fig.axes:
        for axis, (low, high), at in ((ax.xaxis, ax.get_xlim(), 0), (ax.yaxis, ax.get_ylim(), 1)):
            for tick in [*axis.majorTicks, *axis.minorTicks]:
                tick_labels |= {id(tick.label1), id(tick.label2)}
            for label in axis.get_ticklabels():
                if min(low, high) <= label.get_position()[at] <= max(low, high):
                    shown.add(id(label))
    return [
        text
        for text in fig.findobj(Text)
        if text.get_visible()
        and text.get_text().strip()
        and (text.axes is None or text.axes.get_visible())
        and (id(text) not in tick_labels or id(text) in shown)
    ]


def _layout_problems(fig, shown_width_px: float) -> list[str]:
    """Text of a figure that collides with other text or reaches into another panel, or that is
    under 10 px tall when the figure is shown ``shown_width_px`` wide."""
    texts = _drawn_texts(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in texts]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    scale = shown_width_px / (fig.get_figwidth() * fig.dpi)
    problems = []
    for i, (text, box) in enumerate(zip(texts, boxes, strict=True)):
        px = text.get_fontsize() * fig.dpi / 72 * scale
        if px < 10:
            problems.append(f"{text.get_text()!r}: {px:.1f} px")
        problems += [
            f"{text.get_text()!r} collides with {other.get_text()!r}"
            for other, other_box in zip(texts[i + 1 :], boxes[i + 1 :], strict=True)
            if box.overlaps(other_box)
        ]
        if text.axes is not None:  # a panel's own text reaching into another panel
            problems += [
                f"{text.get_text()!r} of {text.axes.get_title()!r} reaches into {ax.get_title()!r}"
                for ax in panels
                if ax is not text.axes and box.overlaps(ax.get_window_extent(renderer))
            ]
    return problems


def test_the_curves_figure_is_legible_at_the_docs_width_with_nothing_colliding(scoring, suite):
    pytest.importorskip("matplotlib")
    # the figure of the docs: every Easy env's panel (and the longest Hard name)
    envs = suite.popgym_envs()
    easy = sorted(scoring.label(env, level) for env, level in envs if level == "easy")
    names = [*easy, "NoisyPositionOnlyPendulumHard (twin)"]
    fig, axes = scoring.curves_figure(names, {"gtrxl": "C0", "gru": "C1"})
    assert [ax.get_title() for ax in axes] == names
    for ax in axes:  # curves over the suite's quick budget
        ax.plot([16_000, 200_000], [0.2, 0.8])
    assert _layout_problems(fig, scoring.DOCS_WIDTH_PX) == []
