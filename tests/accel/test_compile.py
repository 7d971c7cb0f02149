"""compile=true: the compiled acting step and PPO loss compute what the eager ones do."""

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

import rltrans.accel.compile
from rltrans.accel import Accel, CompiledActing, compiled_acting
from rltrans.accel.auto import AutoCompile
from rltrans.accel.compile import AheadOfTime, _load, _package_path
from rltrans.accel.run_speed import CHUNK_COMPILE_SECONDS
from rltrans.accel.threads import ThreadTuner
from rltrans.agents.memory_agent import MemoryAgent
from rltrans.api import unrolled_chunks
from rltrans.buffers.rollout import RolloutBuffer
from rltrans.config import load_config
from rltrans.envs import make_env
from rltrans.learners import PPOConfig, PPOLearner
from rltrans.registry import build_agent
from rltrans.run.checkpoint import load_checkpoint
from rltrans.runtime.actors import LocalActor
from rltrans.train import main as train_main
from tests.agents.test_dt import BOX, DISCRETE, make_dt, random_batch
from tests.agents.test_memory_agent import PPO
from tests.cli.test_train import TINY, summary_line

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
ACT = gym.spaces.Discrete(3)


def tiny_agent(backbone: str = "gtrxl") -> MemoryAgent:
    torch.manual_seed(0)
    return MemoryAgent(OBS, ACT, backbone=backbone, dim=16, layers=2, heads=2, memory=4)


@pytest.fixture(scope="module")
def compiled_pair() -> tuple[MemoryAgent, CompiledActing]:
    """A tiny GTrXL agent with the linear long memory (its read-out made non-zero) and its twin
    acting through the compiled step (compiled once here). The command-line test below
    compiles the window-only default."""
    torch.manual_seed(0)
    eager = MemoryAgent(
        OBS, ACT, backbone="gtrxl", dim=16, layers=2, heads=2, memory=4, long_memory="linear"
    ).eval()
    for block in eager.backbone.blocks:
        nn.init.normal_(block.long.out.weight, std=0.5)
    return eager, CompiledActing(copy.deepcopy(eager))


@pytest.mark.cli
def test_compiled_act_equals_eager_act_across_episode_ends(compiled_pair):
    """The compiled acting step: action, log-prob, value and cached state match the eager act."""
    eager, fast = compiled_pair
    torch.manual_seed(1)
    obs, dones = torch.randn(9, 5, 3), torch.rand(9, 5) < 0.2
    s_eager, s_fast = eager.initial_state(5), fast.initial_state(5)
    for o, done in zip(obs, dones, strict=True):
        out_eager, s_eager = eager.act(o, s_eager, done, deterministic=True)
        out_fast, s_fast = fast.act(o, s_fast, done, deterministic=True)
        assert torch.equal(out_fast.action, out_eager.action)
        torch.testing.assert_close(out_fast.log_prob, out_eager.log_prob, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out_fast.value, out_eager.value, rtol=1e-5, atol=1e-5)
    for a, b in zip(s_fast, s_eager, strict=True):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert len(s_fast.long) == 2 and s_fast.long[0].abs().sum() > 0
    for a, b in zip(s_fast.long, s_eager.long, strict=True):  # the linear memory's S and z
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    before = [t.clone() for t in s_fast if isinstance(t, torch.Tensor)]
    peeked = fast.peek_value(obs[0], s_fast)  # the same program, and no write to the state
    torch.testing.assert_close(peeked, eager.peek_value(obs[0], s_eager), rtol=1e-5, atol=1e-5)
    after = [t for t in s_fast if isinstance(t, torch.Tensor)]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    out, _ = fast.act(obs[0], s_fast, dones[0])  # sampling: the same compiled program
    assert out.action.shape == (5,)
    assert len(fast.program.runners) == 1
    assert compiled_acting(tiny_agent("lstm")) is None  # no pure step to compile: stays eager
    with pytest.raises(ValueError, match="no compilable acting step"):
        CompiledActing(tiny_agent("lstm"))


@pytest.mark.cli
def test_compiled_sampling_follows_the_policy(compiled_pair):
    """Actions sampled by the compiled step have the policy's probabilities, and its
    log-probs are those of the actions it took (its random numbers are really random)."""
    eager, fast = compiled_pair
    torch.manual_seed(2)
    obs, done = torch.randn(5, 3), torch.ones(5, dtype=torch.bool)
    _, inputs = fast.backbone.step_begin(fast.initial_state(5), done, torch.float32)
    with torch.no_grad():
        h = eager.backbone.step(eager.encode(obs), eager.initial_state(5), done)[0]
        probs = eager.policy(h).log_p.exp()  # (5, 3)
        counts = torch.zeros(5, 3)
        for _ in range(2000):
            action, log_prob, *_ = fast.program(obs, torch.tensor(False), *inputs)
            counts[torch.arange(5), action] += 1
            torch.testing.assert_close(log_prob, probs.log().gather(1, action[:, None])[:, 0])
    torch.testing.assert_close(counts / 2000, probs, rtol=0, atol=0.05)


@pytest.mark.cli
def test_compiled_act_takes_the_contexts_of_the_state_after_a_weight_change(compiled_pair):
    """The per-step contexts (xl's W_kR R) are inputs of the compiled program, carried in the
    state: after an in-place update of W_kR and refresh_state, the compiled step equals the
    eager one; with the state from before the refresh it acts on the old contexts."""
    eager = copy.deepcopy(compiled_pair[0])
    fast = CompiledActing(copy.deepcopy(eager))  # the program is cached already: loaded
    torch.manual_seed(3)
    obs, done = torch.randn(4, 5, 3), torch.ones(5, dtype=torch.bool)
    s_eager, s_fast = eager.initial_state(5), fast.initial_state(5)
    for o in obs:
        _, s_eager = eager.act(o, s_eager, done, deterministic=True)
        _, s_fast = fast.act(o, s_fast, done, deterministic=True)
        done = torch.zeros(5, dtype=torch.bool)
    with torch.no_grad():
        for agent in (eager, fast):
            for block in agent.backbone.blocks:
                block.attn.scheme.r_proj.weight.mul_(-3.0)
    stale = copy.deepcopy(s_fast)
    s_eager, s_fast = eager.refresh_state(s_eager), fast.refresh_state(s_fast)
    out_eager, _ = eager.act(obs[0], s_eager, done, deterministic=True)
    out_fast, _ = fast.act(obs[0], s_fast, done, deterministic=True)
    out_stale, _ = fast.act(obs[0], stale, done, deterministic=True)
    torch.testing.assert_close(out_fast.value, out_eager.value, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_fast.log_prob, out_eager.log_prob, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out_stale.value, out_eager.value, rtol=1e-4, atol=1e-4)


@pytest.mark.cli
def test_the_mlp_for_control_acts_through_its_compiled_step_as_eagerly():
    """agent=mlp_continuous (the MuJoCo preset: observation normalisation, a separate critic,
    Gaussian actions) acts through the compiled step: the same means, log-probs and values,
    also after its observation statistics and weights move (they are program inputs), and
    sampled actions drawn from the same generator as eager ones."""
    cfg = load_config(["env=gym", "env.id=Pendulum-v1", "agent=mlp_continuous"])
    obs_space = gym.spaces.Box(-np.inf, np.inf, (5,), np.float32)
    act_space = gym.spaces.Box(-2.0, 2.0, (2,), np.float32)
    torch.manual_seed(0)
    eager = build_agent(cfg.agent, obs_space, act_space)
    fast = CompiledActing(copy.deepcopy(eager))
    assert compiled_acting(eager) is not None
    obs, done = torch.randn(3, 4, 5) * 4 + 2, torch.zeros(4, dtype=torch.bool)

    def check(o, sample_seed=None):
        outs = []
        for agent in (eager, fast):
            if sample_seed is not None:
                torch.manual_seed(sample_seed)
            outs.append(
                agent.act(o, agent.initial_state(4), done, deterministic=sample_seed is None)[0]
            )
        for name in ("action", "env_action", "log_prob", "value"):
            a, b = getattr(outs[1], name), getattr(outs[0], name)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        return outs[0]

    before = check(obs[0])
    for agent in (eager, fast):  # a rollout's statistics and an optimiser step
        agent.update_obs_norm(obs.reshape(-1, 5))
        with torch.no_grad():
            for p in agent.parameters():
                p.add_(0.05)
    after = check(obs[0])
    assert not torch.allclose(after.value, before.value, atol=1e-3)
    check(obs[1], sample_seed=4)
    assert len(fast.program.runners) == 1


@pytest.mark.cli
def test_ahead_of_time_follows_the_parameters_and_compiles_per_shape(tmp_path, monkeypatch):
    """Parameters are inputs, not baked constants: in-place updates, load_state_dict and a
    reassigned buffer all show without recompiling; a new batch shape compiles anew; a later
    instance loads the compiled programs from the cache folder instead of compiling."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    net.register_buffer("shift", torch.zeros(2))

    def fn(x):
        return net(x) + net.shift

    fast = AheadOfTime(fn, net)
    x = torch.randn(4, 3)
    torch.testing.assert_close(fast(x), fn(x))
    with torch.no_grad():
        net[0].weight.mul_(-2.0)  # an optimiser step writes in place
    torch.testing.assert_close(fast(x), fn(x))
    other = nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 2))
    other.register_buffer("shift", torch.full((2,), 3.0))
    net.load_state_dict(other.state_dict())
    torch.testing.assert_close(fast(x), fn(x))
    net.shift = torch.full((2,), -1.0)  # a buffer reassigned, not written
    torch.testing.assert_close(fast(x), fn(x))
    assert len(fast.runners) == 1
    y = torch.randn(7, 3)
    torch.testing.assert_close(fast(y), fn(y))
    assert len(fast.runners) == 2
    assert len(list((tmp_path / "rltrans-aoti").glob("*.pt2"))) == 2

    def no_compiling(*args, **kwargs):
        raise AssertionError("compiled although the program is cached")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiling)
    again = AheadOfTime(fn, net)
    torch.testing.assert_close(again(y), fn(y))


@pytest.mark.cli
def test_without_aotinductor_the_step_falls_back_to_torch_compile(monkeypatch, capsys):
    """Before torch 2.6 (no AOTInductor packages) the same call runs under torch.compile,
    said once on stderr."""
    monkeypatch.setattr(rltrans.accel.compile, "AOTI", False)
    monkeypatch.setattr(rltrans.accel.compile, "_NOTICES", set())
    lin = nn.Linear(3, 2)
    fast = AheadOfTime(lambda x: lin(x).relu(), lin)
    x = torch.randn(4, 3)
    torch.testing.assert_close(fast(x), lin(x).relu())
    y = torch.randn(5, 3)  # a second signature: no second notice
    torch.testing.assert_close(fast(y), lin(y).relu())
    assert capsys.readouterr().err.count("has no AOTInductor packages") == 1


@pytest.mark.cli
def test_a_failing_aotinductor_falls_back_with_a_notice(monkeypatch, capsys):
    """Any failure of export or AOTInductor leaves a working torch.compile step and one line."""

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch.export, "export", broken)
    lin = nn.Linear(3, 2)
    fast = AheadOfTime(lambda x: lin(x).relu(), lin)
    x = torch.randn(4, 3)
    torch.testing.assert_close(fast(x), lin(x).relu())
    err = capsys.readouterr().err
    assert "AOTInductor failed (RuntimeError: no C++ compiler here)" in err


def test_compiled_program_cache_keys_and_unreadable_files(tmp_path):
    """The cache key changes with a literal or a shape and not with a re-export; a missing or
    corrupt package reads as absent (compiled anew), never as an error."""
    lin = nn.Linear(3, 2)

    def key(scale, rows):
        program = torch.export.export(Scaled(lin, scale), (torch.zeros(rows, 3),), strict=False)
        return _package_path(program)

    assert key(0.5, 4) == key(0.5, 4)
    assert len({key(0.5, 4), key(0.25, 4), key(0.5, 5)}) == 3
    assert _load(tmp_path / "missing.pt2") is None
    (tmp_path / "corrupt.pt2").write_bytes(b"not a package")
    assert _load(tmp_path / "corrupt.pt2") is None


class Scaled(nn.Module):
    """lin(x) * scale, scale a literal of the traced graph."""

    def __init__(self, lin: nn.Module, scale: float) -> None:
        super().__init__()
        self.lin, self.scale = lin, scale

    def forward(self, x):
        return self.lin(x) * self.scale


def eager_and_compiled_update(cfg, envs, agent):
    """One rollout of ``agent``, then one PPO update of it eager and of a twin compiled:
    [(metrics, state_dict)] for each."""
    buffer = RolloutBuffer(cfg.algo.num_steps, envs.num_envs, cfg.algo.segment_length, "cpu")
    actor = LocalActor(envs, agent, seed=0, device="cpu")
    actor.collect(buffer)
    buffer.compute_advantages(actor.bootstrap_value(), 0.99, 0.95)
    twin = copy.deepcopy(agent)
    results = []
    for model, compile in ((agent, False), (twin, True)):
        accel = Accel()
        accel.use_compiled(compile)
        learner = PPOLearner(model, PPOConfig(**PPO, lr=1e-3), total_updates=2, accel=accel)
        metrics = learner.update(buffer, torch.Generator().manual_seed(0))
        results.append((metrics, model.state_dict()))
    return results


@pytest.mark.cli
def test_compiled_ppo_update_equals_eager_update():
    """One PPO update (2 epochs x 2 minibatches) on the same rollout, compiled vs eager."""
    cfg = load_config([*TINY, "agent.layers=2"])
    envs = make_env(cfg.env, seed=0)
    torch.manual_seed(0)
    agent = build_agent(cfg.agent, envs.single_observation_space, envs.single_action_space)
    (m_eager, p_eager), (m_fast, p_fast) = eager_and_compiled_update(cfg, envs, agent)
    assert m_eager["approx_kl"] > 0  # the second epoch saw changed weights
    for k in m_eager:
        torch.testing.assert_close(m_fast[k], m_eager[k], rtol=1e-4, atol=1e-5)
    for k in p_eager:
        torch.testing.assert_close(p_fast[k], p_eager[k], rtol=1e-4, atol=1e-5)


@pytest.mark.cli
def test_compile_true_trains_from_the_command_line(tmp_path, capsys):
    args = [*TINY, "agent.layers=2", "compile=true", "total_steps=128", f"run_dir={tmp_path}"]
    assert train_main(args) == 0
    summary = summary_line(capsys.readouterr().out)
    assert summary["status"] == "finished" and summary["global_step"] == 128


def choose(eager: list[float], compiled: list[float], updates: int, **kw):
    """Drive an AutoCompile over ``updates`` updates: eager seconds while it is eager, then
    ``compiled`` seconds (the first one is the compiling update); returns it and the log."""
    calls, lines = [], []
    chooser = AutoCompile(
        updates,
        enable=lambda: calls.append("enable"),
        disable=lambda: calls.append("disable"),
        report=lines.append,
        **kw,
    )
    eager_times, compiled_times = iter(eager), iter(compiled)
    for _ in range(updates):
        on = calls.count("enable") > calls.count("disable")
        chooser.after_update(next(compiled_times) if on else next(eager_times))
    return chooser, calls, lines


def test_auto_compile_stays_eager_when_the_run_is_too_short():
    # 100 updates of 1 s: trying may cost 10 % of the 98 s left, under the 60 s compiling takes.
    chooser, calls, lines = choose([1.0] * 100, [], 100)
    assert chooser.choice == "eager" and calls == []
    assert lines == [
        "compile=auto: staying eager (98 updates left x 1.00 s eager: trying may cost 10% of "
        "that, 10 s, under the ~60 s compiling takes)"
    ]


def test_auto_compile_counts_each_chunk_of_a_chunked_segment_as_a_compilation():
    """agent.chunk=64 in segments of 512 unrolls 8 chunks into the compiled step: the run of
    487 updates x 2.6 s (a budget of 127 s) that compiles at 60 s of expected compilation
    stays eager at 8 x 120 s."""
    cfg = load_config([*TINY, "algo.num_steps=512", "algo.segment_length=512", "agent.chunk=64"])
    assert unrolled_chunks(cfg) == 8
    assert unrolled_chunks(load_config(TINY)) == 1
    seconds = CHUNK_COMPILE_SECONDS * unrolled_chunks(cfg)
    chooser, calls, _ = choose([2.6] * 489, [], 489, compile_seconds=seconds)
    assert chooser.choice == "eager" and calls == []
    chooser, calls, _ = choose([2.6, 2.6], [0.0] + [1.5] * 487, 489)  # one chunk: compiles
    assert chooser.choice == "compiled"


def test_auto_compile_compiles_a_long_run_and_keeps_it_when_faster():
    # 1,000 updates: a tenth of 998 x 1 s = 100 s > 60 s; the compiled updates take 0.6 s
    # (after the 40 s compiling one), 1.67x faster.
    chooser, calls, lines = choose([1.2, 1.0], [40.0] + [0.6] * 998, 1000)
    assert chooser.choice == "compiled" and calls == ["enable"]
    assert lines[0].startswith("compile=auto: compiling (998 updates left x 1.00 s eager")
    assert lines[1] == "compile=auto: compiled updates run 1.67x faster" and len(lines) == 2


def test_auto_compile_goes_back_to_eager_when_compiled_is_not_faster():
    chooser, calls, lines = choose([1.0, 1.0] + [1.0] * 995, [40.0, 0.98, 0.97], 1000)
    assert chooser.choice == "eager" and calls == ["enable", "disable"]
    assert lines[1] == (
        "compile=auto: back to eager (compiled updates took 0.97 s against 1.00 s eager)"
    )


def test_auto_compile_restores_a_checkpoint_choice_without_measuring():
    calls = []
    chooser = AutoCompile(50, enable=lambda: calls.append("enable"), disable=lambda: None)
    chooser.restore("compiled")
    for _ in range(5):
        chooser.after_update(100.0)  # no check against eager times it never measured
    assert chooser.choice == "compiled" and calls == ["enable"]


@pytest.mark.cli
def test_compile_auto_is_the_default_and_a_short_run_stays_eager(tmp_path, capsys):
    args = [*TINY, "total_steps=256", f"run_dir={tmp_path}"]
    assert train_main(args) == 0
    assert "compile=auto: staying eager" in capsys.readouterr().err
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["compile"] == "eager"


@pytest.mark.cli
@pytest.mark.parametrize("continuous", [False, True])
def test_compiled_dt_loss_equals_eager(continuous):
    """compile for offline training: the compiled Decision Transformer loss and its gradients
    equal the eager ones on a padded batch."""
    space = BOX if continuous else DISCRETE
    eager_model = make_dt(space)
    fast_model = copy.deepcopy(eager_model)
    batch = random_batch(space, pad=2)
    loss, metrics = eager_model.loss(batch)
    loss.backward()
    fast_loss, fast_metrics = rltrans.accel.compile.compiled(fast_model.loss)(batch)
    fast_loss.backward()
    torch.testing.assert_close(fast_loss, loss, rtol=1e-5, atol=1e-6)
    for k in metrics:
        torch.testing.assert_close(fast_metrics[k], metrics[k], rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(eager_model.named_parameters(), fast_model.parameters(), strict=True):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_loss_waits_for_the_thread_choice():
    """While torch_threads=auto times thread counts the learner trains through the eager loss
    (compiled kernels keep the thread count of compile time); then through the compiled one,
    compiled once and kept."""

    def loss(batch):
        return batch * 2

    accel = Accel()
    assert accel.program(loss) is loss  # not compiling
    accel.use_compiled(True)
    fast = accel.program(loss)
    assert fast is not loss and accel.program(loss) is fast
    accel.threads = ThreadTuner("learner step", counts=(1, 2))
    assert accel.trialing_threads and accel.program(loss) is loss
    accel.threads.load_state_dict({"chosen": 2})
    assert not accel.trialing_threads and accel.program(loss) is fast
    accel.use_compiled(False)
    assert accel.program(loss) is loss


class Actor:
    """Stands in for LocalActor: records the policy it is told to act through."""

    policy = None

    def use_policy(self, policy):
        self.policy = policy


def test_the_compile_switch_swaps_the_acting_policy_from_outside_the_agent():
    """Accel.use_compiled hands every actor the agent's compiled acting step (one per agent)
    and the agent itself back; the agent never holds a compiled program."""
    agent, lstm = tiny_agent(), tiny_agent("lstm")
    accel, actors = Accel(), [Actor(), Actor(), Actor()]
    for actor, model in zip(actors, (agent, agent, lstm), strict=True):
        accel.act_through(actor, model)
    assert [a.policy for a in actors] == [agent, agent, lstm]
    accel.use_compiled(True)
    assert isinstance(actors[0].policy, CompiledActing) and actors[0].policy.agent is agent
    assert actors[1].policy is actors[0].policy  # one compiled step per agent
    assert actors[2].policy is lstm  # nothing to compile: acts eagerly
    late = Actor()
    accel.act_through(late, agent)  # registered while compiling: compiled at once
    assert late.policy is actors[0].policy
    accel.use_compiled(False)
    assert [a.policy for a in actors] == [agent, agent, lstm]
    assert not any(isinstance(v, CompiledActing | AheadOfTime) for v in vars(agent).values())


LONG_OPTIONS = {
    "delta": ["agent.long_memory=delta"],
    "mixed": ["agent.long_memory=mixed"],
    "compressive": [
        "agent.long_memory=compressive",
        "agent.compressed_slots=2",
        "agent.compression_rate=2",
    ],
    "adaptive_span": ["agent.adaptive_span=true", "agent.span_ramp=2"],
}


@pytest.mark.cli
@pytest.mark.parametrize("kind", list(LONG_OPTIONS))
def test_the_long_memories_compile_to_the_eager_acting_step_and_update(kind):
    """The delta rule, the mixed one (delta and sum rules by head), the compressive memory
    and the adaptive span: their acting step (AOTInductor) and training segment (a
    triangular solve; masked slot attention; a soft mask over the whole window, where eager
    cuts it to the spans' reach) under torch.compile give what eager gives."""
    cfg = load_config([*TINY, "agent.layers=2", *LONG_OPTIONS[kind]])
    envs = make_env(cfg.env, seed=0)
    torch.manual_seed(0)
    agent = build_agent(cfg.agent, envs.single_observation_space, envs.single_action_space)
    for block in agent.backbone.blocks:
        if block.long is not None:
            nn.init.normal_(block.long.out.weight, std=0.5)
        if block.span is not None:  # spans of a quarter to half the window: eager reads less
            nn.init.uniform_(block.span.fraction, 0.25, 0.5)
            assert block.span.reach(agent.backbone.memory) < agent.backbone.memory
    fast = CompiledActing(copy.deepcopy(agent).eval())
    shape = envs.single_observation_space.shape
    obs, dones = torch.randn(6, envs.num_envs, *shape), torch.rand(6, envs.num_envs) < 0.2
    s_eager, s_fast = agent.initial_state(envs.num_envs), fast.initial_state(envs.num_envs)
    with torch.no_grad():
        for o, done in zip(obs, dones, strict=True):
            out_eager, s_eager = agent.eval().act(o, s_eager, done, deterministic=True)
            out_fast, s_fast = fast.act(o, s_fast, done, deterministic=True)
            torch.testing.assert_close(out_fast.value, out_eager.value, rtol=1e-5, atol=1e-5)
    for fast_part, eager_part in zip(s_fast.long, s_eager.long, strict=True):
        torch.testing.assert_close(fast_part, eager_part, rtol=1e-5, atol=1e-5)
    (m_eager, _), (m_fast, _) = eager_and_compiled_update(cfg, envs, agent.train())
    for k in m_eager:
        torch.testing.assert_close(m_fast[k], m_eager[k], rtol=1e-4, atol=1e-5)
