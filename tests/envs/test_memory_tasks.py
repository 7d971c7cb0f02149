"""Torch-native memory tasks (repeat_first, repeat_previous, count_recall, autoencode,
passive_tmaze): what each task asks, checked from outside.

- An oracle that reads the hidden state scores the best return, 1.
- No policy of the current observation alone beats chance: the best lookup table from
  observation to action, chosen in hindsight on the oracle's own data, is an upper bound
  on every memoryless policy, and it stays within a small margin of chance.
- Each batched env equals N single-env Python references stepped in a loop (rewards, ends,
  SAME_STEP autoreset, final_obs, episode statistics), cards dealt like shuffled decks,
  seeds reproduce, CUDA reproduces, frames have the documented shapes.
- Where POPGym is installed: its presets, optimal and random returns, and, with POPGym's
  shuffled decks replayed into the batched env, step-by-step rewards and observations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rltrans.envs.torch_envs import (
    Autoencode,
    CountRecall,
    PassiveTMaze,
    RepeatFirst,
    RepeatPrevious,
    TorchVectorEnv,
    env_kwargs,
    make_torch_env,
)
from rltrans.envs.torch_envs.base import full_shoe, shoe_copies

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
TASKS = ["repeat_first", "repeat_previous", "count_recall", "autoencode", "passive_tmaze"]
SMALL = {  # short episodes for the fast tests
    "repeat_first": {"length": 9},
    "repeat_previous": {"k": 3, "episode_length": 9},
    "count_recall": {"length": 9, "num_symbols": 4},
    "autoencode": {"length": 5},
    "passive_tmaze": {"length": 6},
}


def episode_steps(env: TorchVectorEnv) -> int:
    """Steps per episode (all these tasks have fixed-length episodes)."""
    if isinstance(env, RepeatPrevious):
        return env.episode_length
    if isinstance(env, Autoencode):
        return 2 * env.length - 1
    if isinstance(env, PassiveTMaze):
        return env.length + 1
    return env.length


def oracle(env: TorchVectorEnv) -> torch.Tensor:
    """The right action (N,) of every env, read from the hidden state (any action where
    the step is not graded)."""
    if isinstance(env, RepeatFirst):
        return env.first
    if isinstance(env, RepeatPrevious):
        return env.history[:, 0]
    if isinstance(env, CountRecall):
        return env.counts.gather(1, env.cards[:, 1:])[:, 0]
    if isinstance(env, PassiveTMaze):
        return env.cue
    last = env.length - 1  # Autoencode: c_{2(L-1) - t}; c_{L-1} is still on show at t = L - 1
    recorded = env.cards.gather(1, (2 * last - env.t).clamp(0, last)[:, None])[:, 0]
    return torch.where(env.t == last, env.on_show, recorded)


def finished_returns(env: TorchVectorEnv, policy, episodes: int, seed: int = 0) -> torch.Tensor:
    """Returns of the first `episodes` episodes of every env under `policy(env, obs)`."""
    obs, _ = env.reset(seed=seed)
    returns = []
    for _ in range(episodes * episode_steps(env)):
        obs, _, _, _, info = env.step(policy(env, obs))
        returns.append(info["episode"]["r"][info["_episode"]])
    return torch.cat(returns)


# ---------------------------------------------------------------------------- returns
@pytest.mark.parametrize("name", TASKS)
def test_the_oracle_scores_the_best_return(name):
    env = make_torch_env(name, 64, **SMALL[name])
    returns = finished_returns(env, lambda e, obs: oracle(e), episodes=3)
    assert returns.numel() == 64 * 3
    torch.testing.assert_close(returns, torch.ones_like(returns))


# Uniform random answers: their expected return, and the margin a memoryless policy may
# have over chance: the one step that shows its own answer (1.5 / episode's answers), the
# deck's correlations (a suit other than the one on show: 0.01), the hindsight table's fit
# to its data (0.01; repeat_first's answer is one draw per episode, so more noise).
CHANCE = {
    "repeat_first": (-0.5, 1.5 / 51 + 0.02),  # step 0 shows the answer
    "repeat_previous": (-0.5, 0.03),
    "count_recall": (2 / 27 - 1, 0.02),  # counts 0..26; the count's spread is not uniform
    "autoencode": (-0.5, 1.5 / 52 + 0.01),  # the first play step shows its card
    "passive_tmaze": (0.0, 0.04),
}


@pytest.mark.parametrize("name", TASKS)
def test_no_memoryless_policy_beats_chance(name):
    """The hindsight-best table observation -> action bounds every memoryless policy."""
    kwargs = {"repeat_previous": RepeatPrevious.popgym_presets["easy"]}.get(name, {})
    env = make_torch_env(name, 512, **kwargs)
    obs, _ = env.reset(seed=1)
    episodes = {"passive_tmaze": 20, "repeat_first": 10}.get(name, 3)
    n_actions = int(env.single_action_space.n)
    # weight[o, a]: the reward at stake where observation o asked for action a.
    weight = torch.zeros(2 ** obs.shape[1] * n_actions, dtype=torch.float64)
    codes = 2 ** torch.arange(obs.shape[1])
    returns = []
    for _ in range(episodes * episode_steps(env)):
        answer = oracle(env)
        key = (obs.long() * codes).sum(1) * n_actions + answer
        obs, reward, _, _, info = env.step(answer)
        weight.index_add_(0, key, reward.abs().double())
        returns.append(info["episode"]["r"][info["_episode"]])
    returns = torch.cat(returns)  # the oracle's data
    torch.testing.assert_close(returns, torch.ones_like(returns))
    weight = weight.view(-1, n_actions)
    ceiling = (2 * weight.max(1).values - weight.sum(1)).sum() / (512 * episodes)
    chance, margin = CHANCE[name]
    assert ceiling <= chance + margin, (ceiling, chance)
    # Uniform random answers score chance: the rewards' scale and sign.
    env = make_torch_env(name, 512, **kwargs)
    gen = torch.Generator().manual_seed(2)
    random = finished_returns(
        env, lambda e, o: torch.randint(0, n_actions, (512,), generator=gen), episodes
    )
    assert random.mean().item() == pytest.approx(chance, abs=0.02)


# ---------------------------------------------------------------------------- references
class Ref:
    """One env in plain Python. Random draws are read from the batched env's observations
    (the reset observation and each step's final_obs); everything else the reference
    computes: rewards, ends, observations, episode statistics."""

    def reset(self, row: list[float]) -> list[float]:
        """Start an episode from the draws shown in the reset observation `row`."""
        self.t, self.ret = 0, 0.0
        return self._reset(row)

    def step(self, action: int, row: list[float]) -> tuple[list[float], float, bool, dict]:
        """One step; `row` is the batched env's final_obs row (new draws only)."""
        obs, reward, extras = self._step(action, row)
        self.t, self.ret = self.t + 1, self.ret + reward
        return obs, reward, self.t >= self.steps, extras


def one_hot(i: int, n: int) -> list[float]:
    return [float(j == i) for j in range(n)]


def drawn(row: list[float]) -> int:
    """The symbol of a one-hot row (asserting it is one)."""
    assert sorted(row) == [0.0] * (len(row) - 1) + [1.0], row
    return row.index(1.0)


class RefRepeatFirst(Ref):
    def __init__(self, length: int, s: int) -> None:
        self.steps, self.s = length, s

    def _reset(self, row):
        self.first = drawn(row)
        return one_hot(self.first, self.s)

    def answer(self) -> int:
        return self.first

    def _step(self, a, row):
        return one_hot(drawn(row), self.s), (1.0 if a == self.first else -1.0) / self.steps, {}


class RefCountRecall(Ref):
    def __init__(self, length: int, s: int) -> None:
        self.steps, self.s = length, s

    def _show(self, row):
        self.value, self.query = drawn(row[: self.s]), drawn(row[self.s :])
        self.counts[self.value] += 1
        return one_hot(self.value, self.s) + one_hot(self.query, self.s)

    def _reset(self, row):
        self.counts = [0] * self.s
        return self._show(row)

    def answer(self) -> int:
        return self.counts[self.query]

    def _step(self, a, row):
        reward = (1.0 if a == self.answer() else -1.0) / self.steps
        return self._show(row), reward, {}


class RefAutoencode(Ref):
    def __init__(self, length: int, s: int) -> None:
        self.n, self.steps, self.s = length, 2 * length - 1, s

    def _reset(self, row):
        self.seen = [drawn(row[1:])]
        return [float(self.n > 1), *one_hot(self.seen[0], self.s)]  # watching unless L = 1

    def answer(self) -> int:
        return self.seen[2 * (self.n - 1) - self.t] if self.t >= self.n - 1 else 0

    def _step(self, a, row):
        if self.t < self.n - 1:  # watching: the next card
            self.seen.append(drawn(row[1:]))
            return [float(self.t + 1 < self.n - 1), *row[1:]], 0.0, {}
        return [0.0] * (1 + self.s), (1.0 if a == self.answer() else -1.0) / self.n, {}


class RefPassiveTMaze(Ref):
    def __init__(self, length: int) -> None:
        self.n, self.steps = length, length + 1

    def _reset(self, row):
        self.cue = drawn(row[:2])
        return [*one_hot(self.cue, 2), float(self.n == 0)]

    def answer(self) -> int:
        return self.cue

    def _step(self, a, row):
        if self.t == self.n:  # the turn
            return [0.0, 0.0, 0.0], 1.0 if a == self.cue else -1.0, {"success": a == self.cue}
        return [0.0, 0.0, float(self.t + 1 == self.n)], 0.0, {"success": False}


REFS = {
    "repeat_first": (RepeatFirst, {"length": 7, "num_symbols": 3}, lambda: RefRepeatFirst(7, 3)),
    "count_recall": (CountRecall, {"length": 8, "num_symbols": 3}, lambda: RefCountRecall(8, 3)),
    "autoencode": (Autoencode, {"length": 4, "num_symbols": 3}, lambda: RefAutoencode(4, 3)),
    "passive_tmaze": (PassiveTMaze, {"length": 5}, lambda: RefPassiveTMaze(5)),
}


@pytest.mark.parametrize("name", list(REFS))
def test_batched_env_equals_per_env_references(name):
    cls, kwargs, make_ref = REFS[name]
    n, rng = 12, np.random.default_rng(0)
    env, refs = cls(num_envs=n, **kwargs), [make_ref() for _ in range(n)]
    obs, _ = env.reset(seed=3)
    for i, ref in enumerate(refs):
        assert ref.reset(obs[i].tolist()) == obs[i].tolist()
    ends = set()
    for t in range(120):
        if t in (5, 17, 40):  # partial resets put the fixed-length episodes out of phase
            mask = rng.random(n) < 0.4
            before = obs.tolist()
            obs, _ = env.reset(options={"reset_mask": torch.as_tensor(mask)})
            for i, ref in enumerate(refs):
                assert obs[i].tolist() == (ref.reset(obs[i].tolist()) if mask[i] else before[i])
        right = [ref.answer() for ref in refs]
        guess = rng.integers(0, env.single_action_space.n, n)
        actions = np.where(rng.random(n) < 0.5, right, guess)  # half right, half guessed
        obs, reward, term, trunc, info = env.step(actions)
        final, rows = info["final_obs"].tolist(), obs.tolist()
        for i, ref in enumerate(refs):
            want_obs, want_reward, ended, extras = ref.step(int(actions[i]), final[i])
            where = (t, i)
            assert final[i] == want_obs and reward[i].item() == pytest.approx(want_reward), where
            assert (term[i].item(), trunc[i].item()) == (ended, False), where
            assert info["_episode"][i].item() == info["_final_obs"][i].item() == ended, where
            for key, value in extras.items():
                assert info[key][i].item() == (value and ended), where
            if ended:
                assert info["episode"]["r"][i].item() == pytest.approx(ref.ret, abs=1e-5)
                assert info["episode"]["l"][i].item() == ref.steps
                ends.add((t, i))
                assert ref.reset(rows[i]) == rows[i], where  # SAME_STEP: the next episode
            else:
                assert rows[i] == final[i] and info["episode"]["l"][i].item() == 0, where
    assert {i for _, i in ends} == set(range(n)) and len({t for t, _ in ends}) > 5


# ---------------------------------------------------------------------------- decks
def test_a_shoe_deals_every_card_once_in_uniform_order():
    env = RepeatFirst(num_envs=4096, length=51)  # one 52-card deck: 13 of each suit
    env.reset(seed=0)
    shoe = full_shoe(4, 13, "cpu").expand(4096, 4)
    dealt = []
    for _ in range(52):
        symbol, shoe = env._deal(shoe)
        dealt.append(symbol)
    seq = torch.stack(dealt, 1)  # (N, 52)
    assert (torch.stack([(seq == s).sum(1) for s in range(4)], 1) == 13).all()
    assert shoe.eq(0).all()  # empty, and it stays so, dealing symbol S
    symbol, again = env._deal(shoe)
    assert symbol.eq(4).all() and again.eq(0).all()
    freq = torch.stack([(seq == s).float().mean(0) for s in range(4)])  # (4, 52)
    assert (freq - 0.25).abs().max() < 0.03  # every position is uniform
    # Without replacement: the next card repeats a suit with probability 12/51, not 1/4.
    assert (seq[:, 1:] == seq[:, :-1]).float().mean().item() == pytest.approx(12 / 51, abs=0.003)


def test_shoes_hold_enough_decks():
    assert [shoe_copies(s, 52) for s in (2, 4, 13)] == [26, 13, 4]
    assert shoe_copies(4, 53) == 26 and shoe_copies(3, 52) == 18 and shoe_copies(60, 2) == 1
    # count_recall's actions are the counts a shoe allows: POPGym's 27 / 27 / 17.
    sizes = [CountRecall(1, **p).single_action_space.n for p in CountRecall.popgym_presets.values()]
    assert sizes == [27, 27, 17]


# ---------------------------------------------------------------------------- API
@pytest.mark.parametrize("name", TASKS)
def test_seeds_reproduce_and_differ(name):
    def rollout(seed: int) -> torch.Tensor:
        env = make_torch_env(name, 16, **SMALL[name])
        obs, _ = env.reset(seed=seed)
        trace, gen = [obs], torch.Generator().manual_seed(0)
        for _ in range(30):
            acts = torch.randint(0, int(env.single_action_space.n), (16,), generator=gen)
            obs, reward, *_ = env.step(acts)
            trace += [obs, reward[:, None]]
        return torch.cat(trace, 1)

    assert torch.equal(rollout(1), rollout(1)) and not torch.equal(rollout(1), rollout(2))


def answers_change_nothing_later(name: str, **kwargs) -> bool:
    """Two copies of a task from one seed, answered differently at odd steps and alike at even
    ones: True if they show the same observations throughout and pay the same where the
    answers agree."""
    envs = [make_torch_env(name, 16, **kwargs) for _ in range(2)]
    obs = [env.reset(seed=3)[0] for env in envs]
    gens = [torch.Generator().manual_seed(s) for s in (0, 1)]
    n = int(envs[0].single_action_space.n)
    for t in range(40):
        a = torch.randint(0, n, (16,), generator=gens[0])
        acts = [a, torch.randint(0, n, (16,), generator=gens[1]) if t % 2 else a]
        steps = [env.step(a) for env, a in zip(envs, acts, strict=True)]
        if not torch.equal(obs[0], obs[1]):
            return False
        same = acts[0] == acts[1]
        if not torch.equal(steps[0][1][same], steps[1][1][same]):
            return False
        obs = [step[0] for step in steps]
    return True


def test_popgyms_tasks_and_the_passive_tmaze_are_those_whose_answers_change_nothing_later():
    """In POPGym's tasks and the passive T-maze no action changes what the task shows or pays
    later (each reward grades its own step's action); the T-maze's moves steer. No agent is
    told: the agent's defaults have to learn both kinds."""
    for name in ("repeat_first", "repeat_previous", "count_recall", "autoencode"):
        assert answers_change_nothing_later(name, **SMALL[name]), name
    assert answers_change_nothing_later("passive_tmaze", **SMALL["passive_tmaze"])
    assert not answers_change_nothing_later("tmaze", length=3)


@pytest.mark.parametrize("name", TASKS)
def test_spaces_and_registry(name):
    env = make_torch_env(name, 3, **SMALL[name])
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs.numpy()) and obs.dtype == torch.float32
    assert "length" in env_kwargs(name) or "k" in env_kwargs(name)
    *_, info = env.step(env.action_space.sample())
    assert info["final_obs"].shape == obs.shape


@CUDA
@pytest.mark.parametrize("name", TASKS)
def test_cuda_reproduces_and_the_oracle_still_wins(name):
    def rollout() -> torch.Tensor:
        env = make_torch_env(name, 32, device="cuda", validate_actions=False, **SMALL[name])
        obs, _ = env.reset(seed=0)
        trace = [obs]
        for _ in range(2 * episode_steps(env)):
            obs, reward, _, _, info = env.step(oracle(env))
            assert obs.device.type == reward.device.type == "cuda"
            trace.append(info["episode"]["r"][:, None])
        return torch.cat(trace, 1)

    a, b = rollout(), rollout()
    assert torch.equal(a, b)
    returns = a[:, -1]  # every env ended its second episode on the last step
    torch.testing.assert_close(returns.cpu(), torch.ones(32))


@pytest.mark.parametrize(
    ("cls", "kwargs", "match"),
    [
        (RepeatFirst, {"length": 0}, "length must be an int >= 1, got 0"),
        (RepeatFirst, {"num_symbols": 1}, "num_symbols must be an int >= 2, got 1"),
        (CountRecall, {"length": 2.5}, "length must be an int >= 1"),
        (Autoencode, {"length": True}, "length must be an int >= 1"),
        (PassiveTMaze, {"length": -3}, "length must be an int >= 1, got -3"),
    ],
)
def test_constructor_errors(cls, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cls(num_envs=2, **kwargs)


# ---------------------------------------------------------------------------- frames
# Frame (H, W) in pixels for SMALL's kwargs: see each module's docstring.
FRAMES = {
    "repeat_first": (20, 160),  # 2 x 16 cells of 10 px
    "repeat_previous": (20, 90),  # 2 x max(k + 4, episode_length) cells of 10 px
    "count_recall": (50, 150),  # (S + 1) x (copies + 2) cells of 10 px: S = 4, copies = 13
    "autoencode": (20, 50),  # (1 + 1 row) x max(length, 4) cells of 10 px
    "passive_tmaze": (36, 84),  # 3 x (length + 1) cells of 12 px
}


@pytest.mark.parametrize("name", TASKS)
def test_frames_have_their_shape_and_follow_the_state(name):
    env = make_torch_env(name, 3, render_mode="rgb_array", **SMALL[name])
    env.reset(seed=0)
    before = env.render()
    assert len(before) == 3
    assert all(f.shape == (*FRAMES[name], 3) and f.dtype == np.uint8 for f in before)
    env.step(torch.ones(3, dtype=torch.long))
    assert not np.array_equal(before[0], env.render()[0])


def test_long_tasks_draw_bounded_frames():
    """Long corridors and sequences fold into frames of bounded width."""
    for name, width in [("passive_tmaze", 64 * 12), ("autoencode", 26 * 10)]:
        env = make_torch_env(name, 1, render_mode="rgb_array", length=1024)
        env.reset(seed=0)
        assert env.render()[0].shape[1] == width


def test_passive_tmaze_frame_ends_in_the_arm_turned_into():
    env = PassiveTMaze(num_envs=2, length=3, render_mode="rgb_array")
    env.reset(seed=0)
    for _ in range(3):
        env.step(torch.zeros(2, dtype=torch.long))
    at_junction = env.render()[0]
    *_, info = env.step(torch.tensor([0, 1]))  # env 0 turns up, env 1 down
    assert info["_episode"].all()
    up, down = env.render()
    mid = 12 // 2  # the middle of a cell: the agent's square is black
    assert (at_junction[12 + mid, 3 * 12 + mid] == 0).all()
    assert (up[mid, 3 * 12 + mid] == 0).all() and (down[2 * 12 + mid, 3 * 12 + mid] == 0).all()


# ---------------------------------------------------------------------------- POPGym
# Task -> (our class, POPGym's class name prefix); presets easy / medium / hard.
POPGYM = {
    "repeat_first": (RepeatFirst, "RepeatFirst"),
    "repeat_previous": (RepeatPrevious, "RepeatPrevious"),
    "count_recall": (CountRecall, "CountRecall"),
    "autoencode": (Autoencode, "Autoencode"),
}
CASES = [(task, level) for task in POPGYM for level in ("easy", "medium", "hard")]


def popgym_env(task: str, level: str):
    """POPGym's env for a task and difficulty (the test skips without POPGym)."""
    envs = pytest.importorskip("popgym.envs")
    return getattr(envs, POPGYM[task][1] + level.capitalize())()


def popgym_oracle(env) -> int:
    """POPGym's right action, read from its hidden state."""
    name = type(env).__name__
    if name.startswith("RepeatFirst"):
        return int(env.card)
    if name.startswith("RepeatPrevious"):
        hand = env.deck["player"]
        return int(env.deck.suits_idx[hand[-env.k]]) if len(hand) >= env.k else 0
    if name.startswith("CountRecall"):
        return int(env.counts[env.query])
    playing = env.mode == 0  # Autoencode: the last card not yet named
    return int(env.deck.suits_idx[env.deck["system"][-1]]) if playing else 0


def popgym_deals(env) -> np.ndarray:
    """The symbols POPGym deals this episode, in order: (T,), or (2, T) for count_recall's
    value and query decks. POPGym deals from the end of its shuffled index."""
    if hasattr(env, "value_deck"):
        decks = (env.value_deck.idx, env.query_deck.idx)
        return np.stack([env.deck_idx_type[idx[::-1]] for idx in decks])
    return env.deck.suits_idx[env.deck.idx[::-1]]


def popgym_obs(env, obs, ours: TorchVectorEnv) -> list[float]:
    """POPGym's observation in our encoding."""
    s = int(ours.single_action_space.n) if not isinstance(ours, CountRecall) else ours.num_symbols
    if isinstance(ours, CountRecall):
        return one_hot(int(obs[0]), s) + one_hot(int(obs[1]), s)
    if isinstance(ours, Autoencode):  # (mode, suit); play shows suit 0 as filler after c_{L-1}
        mode, suit = obs
        last_card = len(env.deck["system"]) == env.deck.num_cards  # all dealt, none named
        shown = mode == 1 or last_card
        return [float(mode), *(one_hot(int(suit), s) if shown else [0.0] * s)]
    return one_hot(int(obs), s)


def replay(env: TorchVectorEnv, script: torch.Tensor) -> None:
    """Make `env` deal the symbols of `script` (N, ..., T) in order instead of drawing them:
    the card dealt next is the one after the cards already gone from the shoe."""
    total, s = script.shape[-1], env._full_shoe.numel()

    def deal(shoe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gone = (total - shoe[..., -1]).long().clamp(max=total - 1)
        symbol = script.gather(-1, gone.unsqueeze(-1)).squeeze(-1)
        symbol = torch.where(shoe[..., -1] > 0, symbol, s)  # an empty shoe deals S
        return symbol, shoe - (torch.arange(s) >= symbol.unsqueeze(-1)).double()

    env._deal = deal
    env._deal_fresh = lambda full, shape: deal(full.expand(*shape, s))


@pytest.mark.parametrize(("task", "level"), CASES)
def test_popgym_presets_and_decks_replayed_give_popgym_rewards(task, level):
    """The same shuffled decks and actions give POPGym's rewards, ends and observations."""
    n, rng = 3, np.random.default_rng(0)
    theirs = [popgym_env(task, level) for _ in range(n)]
    first_obs = [env.reset(seed=i)[0] for i, env in enumerate(theirs)]
    cls = POPGYM[task][0]
    ours = cls(num_envs=n, **cls.popgym_presets[level])
    assert ours.single_action_space == theirs[0].action_space
    assert episode_steps(ours) == theirs[0].max_episode_length
    replay(ours, torch.as_tensor(np.stack([popgym_deals(env) for env in theirs])))
    obs, _ = ours.reset(seed=0)
    for i, env in enumerate(theirs):
        assert obs[i].tolist() == popgym_obs(env, first_obs[i], ours)
    returns = np.zeros(n)
    for t in range(episode_steps(ours)):
        # Half the answers right: rewards of both signs, and of 0 where not graded.
        actions = [popgym_oracle(env) if rng.random() < 0.5 else 0 for env in theirs]
        _, reward, term, _, info = ours.step(torch.tensor(actions))
        for i, env in enumerate(theirs):
            their_obs, their_reward, their_term, _, _ = env.step(actions[i])
            returns[i] += their_reward
            assert reward[i].item() == pytest.approx(their_reward, rel=1e-5, abs=1e-9), (t, i)
            assert term[i].item() == their_term, (t, i)
            assert info["final_obs"][i].tolist() == popgym_obs(env, their_obs, ours), (t, i)
    assert term.all()
    # float32 sums of up to 311 rewards against float64 ones.
    torch.testing.assert_close(
        info["episode"]["r"].double(), torch.as_tensor(returns), atol=1e-5, rtol=0
    )
    assert (returns > -1).all() and (returns < 1).all() and len(set(returns.round(6))) > 1


@pytest.mark.parametrize("task", list(POPGYM))
def test_optimal_and_random_returns_match_popgym(task):
    """Mean returns of the optimal and of the uniform random policy, POPGym's easy preset."""
    rng = np.random.default_rng(1)
    env = popgym_env(task, "easy")
    n_actions = int(env.action_space.n)
    means = []
    for policy in (lambda: popgym_oracle(env), lambda: int(rng.integers(n_actions))):
        returns = []
        for episode in range(100 if len(means) else 10):
            env.reset(seed=episode)
            total, done = 0.0, False
            while not done:
                _, reward, done, _, _ = env.step(policy())
                total += reward
            returns.append(total)
        means.append(np.mean(returns))
    cls = POPGYM[task][0]
    ours = cls(num_envs=400, **cls.popgym_presets["easy"])
    gen = torch.Generator().manual_seed(2)
    optimal = finished_returns(ours, lambda e, obs: oracle(e), episodes=1)
    random = finished_returns(
        ours, lambda e, obs: torch.randint(0, n_actions, (400,), generator=gen), episodes=1
    )
    assert means[0] == pytest.approx(1.0) and optimal.mean().item() == pytest.approx(1.0)
    # Standard errors: about 0.012 (POPGym, 100 episodes) and 0.006 (ours, 400).
    assert random.mean().item() == pytest.approx(means[1], abs=0.05)
