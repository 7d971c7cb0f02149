"""Decision Transformer and BC: token layout, causality, padding, acting == batched forward."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rltrans.agents.dt import (
    BehaviorCloning,
    DecisionTransformer,
    DTState,
    build_decision_transformer,
)
from rltrans.backbones.causal import causal_stack, gpt2_config
from rltrans.buffers.trajectory import TrajectoryBatch, TrajectoryStats

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(4, start=1)  # start != 0 checks the index shift
BOX = gym.spaces.Box(np.array([-2, 0], np.float32), np.array([2, 1], np.float32))
K = 5
STATS = TrajectoryStats(
    state_mean=torch.tensor([0.5, -1.0, 2.0]),
    state_std=torch.tensor([2.0, 0.5, 1.5]),
    return_scale=10.0,
    max_timestep=40,
)


def make_dt(action_space: gym.Space = DISCRETE, **kw) -> DecisionTransformer:
    kw = {"dim": 16, "layers": 2, "heads": 2, "context": K, "dropout": 0.0, **kw}
    model = build_decision_transformer(OBS, action_space, stats=STATS, **kw)
    return model.eval()


def random_actions(space: gym.Space, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    if isinstance(space, gym.spaces.Discrete):
        return torch.randint(space.start, space.start + space.n, shape, generator=g)
    low, high = torch.as_tensor(space.low), torch.as_tensor(space.high)
    return low + (high - low) * torch.rand(*shape, *space.shape, generator=g)


def random_batch(space: gym.Space = DISCRETE, b: int = 3, pad: int = 0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(b, K, dtype=torch.bool)
    mask[:, :pad] = False
    return TrajectoryBatch(
        states=torch.randn(b, K, 3, generator=g) * 3,
        actions=random_actions(space, (b, K), g),
        returns_to_go=torch.randn(b, K, 1, generator=g) * 20,
        timesteps=torch.randint(0, 40, (b, K), generator=g),
        mask=mask,
    )


def replace(batch: TrajectoryBatch, **fields) -> TrajectoryBatch:
    return TrajectoryBatch(**{**vars(batch), **fields})


# ------------------------------------------------------------------------------ tokens


def test_causal_stack_defaults_are_gpt2():
    stack = causal_stack(gpt2_config(dim=16, heads=2), layers=3)
    assert stack.memory == 0 and stack.causal and stack.input_position is None
    assert isinstance(stack.final_norm, torch.nn.LayerNorm)  # GPT-2's ln_f
    block = stack.blocks[0]
    assert block.attn.dropout == 0.1
    # GPT-2 init: N(0, 0.02) projections, residual projections scaled by 1/sqrt(2 * layers).
    assert block.attn.qkv_proj.weight.std().item() == pytest.approx(0.02, rel=0.2)
    assert block.attn.out_proj.weight.std().item() == pytest.approx(0.02 / 6**0.5, rel=0.2)
    assert not block.attn.qkv_proj.bias.any()
    with pytest.raises(ValueError, match="gpt2"):
        causal_stack(gpt2_config(dim=16, heads=1), layers=1, init="xavier")


def test_tokens_interleave_return_state_action_with_timestep():
    model = make_dt()
    batch = random_batch()
    tokens = model.embed_tokens(batch)  # (B, 3K, D)
    assert tokens.shape == (3, 3 * K, 16)
    time = model.embed_timestep(batch.timesteps)  # (B, K, D)
    r = model.embed_return(batch.returns_to_go / STATS.return_scale) + time
    states = (batch.states - STATS.state_mean) / STATS.state_std  # normalised by the model
    s = model.embed_state.linear(states) + time
    a = model.action_codec.embed(batch.actions - DISCRETE.start) + time
    for t in range(K):
        torch.testing.assert_close(tokens[:, 3 * t], r[:, t])
        torch.testing.assert_close(tokens[:, 3 * t + 1], s[:, t])
        torch.testing.assert_close(tokens[:, 3 * t + 2], a[:, t])


def test_action_read_from_state_tokens():
    model = make_dt()
    batch = random_batch()
    h = model.hidden(batch)  # (B, K, 3, D)
    torch.testing.assert_close(model(batch), model.action_codec.head(h[:, :, 1]))


@pytest.mark.parametrize("space", [DISCRETE, BOX], ids=["discrete", "continuous"])
def test_prediction_t_sees_returns_states_to_t_and_actions_before_t(space):
    """Perturbing a_t or anything later leaves the step-t prediction unchanged; R_t, s_t,
    a_{t-1} and the timestep of t each change it (causality; Chen et al. 2021 token order)."""
    model = make_dt(space)
    batch = random_batch(space)
    base = model(batch)
    g = torch.Generator().manual_seed(1)
    for t in range(K):
        for name in ("returns_to_go", "states", "actions", "timesteps"):
            value = getattr(batch, name).clone()
            if name == "actions":
                value[:, t] = random_actions(space, (3,), g)
                if isinstance(space, gym.spaces.Discrete):  # make sure it really changed
                    value[:, t] = (batch.actions[:, t] - space.start + 1) % space.n + space.start
            elif name == "timesteps":
                value[:, t] = (value[:, t] + 7) % 40
            else:
                value[:, t] += 5.0
            out = model(replace(batch, **{name: value}))
            first_affected = t + 1 if name == "actions" else t
            torch.testing.assert_close(out[:, :first_affected], base[:, :first_affected])
            if first_affected < K:
                assert not torch.allclose(out[:, first_affected], base[:, first_affected])


@pytest.mark.parametrize("space", [DISCRETE, BOX], ids=["discrete", "continuous"])
def test_padded_steps_do_not_influence_real_outputs(space):
    model = make_dt(space)
    pad = 2
    batch = random_batch(space, pad=pad)
    base = model(batch)
    assert torch.isfinite(base).all()
    g = torch.Generator().manual_seed(5)
    noisy = replace(
        batch,
        states=torch.where(batch.mask[..., None], batch.states, torch.randn(3, K, 3, generator=g)),
        returns_to_go=batch.returns_to_go + 100.0 * ~batch.mask[..., None],
        timesteps=torch.where(batch.mask, batch.timesteps, 33),
        actions=torch.where(
            batch.mask.view(3, K, *[1] * (batch.actions.dim() - 2)),
            batch.actions,
            random_actions(space, (3, K), g),
        ),
    )
    out = model(noisy)
    torch.testing.assert_close(out[:, pad:], base[:, pad:])


def test_continuous_actions_within_bounds_and_loss_in_unit_scale():
    model = make_dt(BOX)
    batch = random_batch(BOX)
    pred = model(batch)
    assert pred.shape == (3, K, 2)
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    assert ((pred >= low) & (pred <= high)).all()
    loss, metrics = model.loss(batch)
    # Squared error after mapping both bounds to [-1, 1] (half-ranges 2 and 0.5).
    unit = lambda a: (a - torch.tensor([0.0, 0.5])) / torch.tensor([2.0, 0.5])  # noqa: E731
    expected = (unit(pred) - unit(batch.actions)).pow(2).mean()
    torch.testing.assert_close(loss, expected)
    assert set(metrics) == {"action"}


def test_discrete_loss_is_cross_entropy_over_real_steps():
    model = make_dt()
    batch = random_batch(pad=2)
    logits = model(batch)
    loss, metrics = model.loss(batch)
    target = batch.actions - DISCRETE.start
    expected = torch.nn.functional.cross_entropy(
        logits[:, 2:].flatten(0, 1), target[:, 2:].flatten()
    )
    torch.testing.assert_close(loss, expected)
    assert "accuracy" in metrics


def test_timesteps_beyond_embedding_are_clamped():
    model = make_dt()
    batch = random_batch()
    late = replace(batch, timesteps=batch.timesteps + 1000)
    clamped = replace(batch, timesteps=torch.full_like(batch.timesteps, STATS.max_timestep - 1))
    torch.testing.assert_close(model(late), model(clamped))
    assert model.embed_timestep.num_embeddings == STATS.max_timestep


# ------------------------------------------------------------------------------ stats


def test_stats_live_in_state_dict_and_normalise_states():
    model = make_dt()
    sd = model.state_dict()
    assert torch.equal(sd["state_mean"], STATS.state_mean) and sd["return_scale"].item() == 10.0
    fresh = build_decision_transformer(
        OBS, DISCRETE, dim=16, layers=2, heads=2, context=K, dropout=0.0, max_timestep=40
    )
    fresh.load_state_dict(sd)
    batch = random_batch()
    torch.testing.assert_close(fresh.eval()(batch), model(batch))
    # A model without stats on pre-normalised inputs equals the model with stats on raw ones.
    plain = build_decision_transformer(
        OBS, DISCRETE, dim=16, layers=2, heads=2, context=K, dropout=0.0, max_timestep=40
    ).eval()
    plain.load_state_dict({**sd, "state_mean": torch.zeros(3), "state_std": torch.ones(3)})
    plain.return_scale.fill_(1.0)
    scaled = replace(
        batch,
        states=(batch.states - STATS.state_mean) / STATS.state_std,
        returns_to_go=batch.returns_to_go / STATS.return_scale,
    )
    torch.testing.assert_close(plain(scaled), model(batch))


# ------------------------------------------------------------------------------ acting


def rollout(model, obs, rewards, targets, done):
    """Act over T steps for N envs; returns the prediction (N, A) at every step and the state."""
    state = model.initial_state(obs.shape[1], targets)
    preds, actions = [], []
    for t in range(obs.shape[0]):
        (action, *_), state = model.act(obs[t], state, done[t])
        preds.append(model.predict_context(state))  # a_t is filled in: causally invisible
        actions.append(action)
        state = model.observe(state, rewards[t])
    return torch.stack(preds), torch.stack(actions), state


def windows_by_hand(obs, actions, rewards, target, k):
    """For one env and every step t: the left-padded window of steps max(0, t-k+1)..t."""
    t_len = obs.shape[0]
    rtg = target - torch.cat([torch.zeros(1), rewards.cumsum(0)[:-1]])  # R_t = target - sum r_<t
    out = []
    for t in range(t_len):
        lo = max(0, t - k + 1)
        n, pad = t + 1 - lo, k - (t + 1 - lo)
        steps = torch.arange(lo, t + 1)

        def left(x, steps=steps, pad=pad):
            return torch.cat([torch.zeros(pad, *x.shape[1:], dtype=x.dtype), x[steps]])

        out.append(
            TrajectoryBatch(
                states=left(obs),
                actions=left(actions),
                returns_to_go=left(rtg[:, None]),
                timesteps=left(torch.arange(t_len)),
                mask=torch.arange(k) >= pad,
            )
        )
        assert int(out[-1].mask.sum()) == n
    return TrajectoryBatch(**{f: torch.stack([getattr(w, f) for w in out]) for f in vars(out[0])})


@pytest.mark.parametrize("space", [DISCRETE, BOX], ids=["discrete", "continuous"])
def test_acting_equals_batched_forward_on_the_same_trajectory(space):
    """Cached context == recomputed window, also once the context slides."""
    model = make_dt(space)
    t_len, n = 3 * K, 2
    g = torch.Generator().manual_seed(2)
    obs = torch.randn(t_len, n, 3, generator=g)
    rewards = torch.randint(0, 3, (t_len, n), generator=g).float()
    targets = torch.tensor([30.0, 5.0])
    done = torch.zeros(t_len, n, dtype=torch.bool)
    done[0] = True
    preds, actions, state = rollout(model, obs, rewards, targets, done)
    for i in range(n):
        batch = windows_by_hand(obs[:, i], actions[:, i], rewards[:, i], targets[i], K)
        expected = model(batch)[:, -1]  # (T, A)
        torch.testing.assert_close(preds[:, i], expected, atol=1e-5, rtol=1e-5)
        if isinstance(space, gym.spaces.Box):  # continuous actions are the prediction itself
            torch.testing.assert_close(actions[:, i], expected, atol=1e-5, rtol=1e-5)
        else:
            assert torch.equal(actions[:, i], expected.argmax(-1) + space.start)
    assert state.valid.tolist() == [K, K] and state.time.tolist() == [t_len, t_len]
    torch.testing.assert_close(state.next_return, targets - rewards.sum(0))


def test_per_env_reset_isolates_envs():
    model = make_dt()
    t_len, n, reset_at = 2 * K + 2, 3, 6
    g = torch.Generator().manual_seed(4)
    obs = torch.randn(t_len, n, 3, generator=g)
    rewards = torch.randint(0, 3, (t_len, n), generator=g).float()
    targets = torch.tensor([10.0, 20.0, 30.0])
    done = torch.zeros(t_len, n, dtype=torch.bool)
    done[0] = True
    done[reset_at, 1] = True  # env 1 starts a new episode at this observation
    preds, _, _ = rollout(model, obs, rewards, targets, done)
    for i in range(n):  # each env alone gives the same predictions: envs do not mix
        alone, _, _ = rollout(model, obs[:, i : i + 1], rewards[:, i : i + 1], targets[i : i + 1],
                              done[:, i : i + 1])  # fmt: skip
        torch.testing.assert_close(preds[:, i], alone[:, 0])
    # After its reset, env 1 equals a fresh episode started there: nothing of the old one.
    fresh, _, _ = rollout(
        model, obs[reset_at:, 1:2], rewards[reset_at:, 1:2], targets[1:2], done[reset_at:, 1:2]
    )
    torch.testing.assert_close(preds[reset_at:, 1], fresh[:, 0])


def test_acting_state_layout_and_errors():
    model = make_dt()
    state = model.initial_state(2, 7.0)
    assert isinstance(state, DTState) and state.target.tolist() == [7.0, 7.0]
    assert state.states.shape == (2, K, 3) and state.actions.shape == (2, K)
    (action, *_), state = model.act(np.zeros((2, 3)), state, np.array([True, True]))
    assert action.shape == (2,) and ((action >= 1) & (action <= 4)).all()
    assert state.valid.tolist() == [1, 1] and state.returns_to_go[:, -1].tolist() == [7.0, 7.0]
    (sampled, *_), _ = model.act(np.zeros((2, 3)), state, None, deterministic=False)
    assert ((sampled >= 1) & (sampled <= 4)).all()
    with pytest.raises(ValueError, match=r"want \(3,\)"):
        model.initial_state(3, torch.zeros(2))


def test_bad_spaces_are_named():
    with pytest.raises(ValueError, match="action_tanh"):
        build_decision_transformer(OBS, gym.spaces.Box(-np.inf, np.inf, (2,)), dim=8, heads=1)
    with pytest.raises(ValueError, match="supported"):
        build_decision_transformer(OBS, gym.spaces.MultiBinary(3), dim=8, heads=1)
    unbounded = build_decision_transformer(
        OBS, gym.spaces.Box(-np.inf, np.inf, (2,)), dim=8, heads=1, action_tanh=False
    )
    assert unbounded(random_batch(BOX)).shape == (3, K, 2)


def test_predict_next_adds_return_and_state_losses():
    model = make_dt(predict_next=True)
    batch = random_batch(pad=1)
    out = model.predict(batch)
    assert out.next_return.shape == (3, K, 1) and out.next_state.shape == (3, K, 3)
    loss, metrics = model.loss(batch)
    assert {"action", "return", "state"} <= set(metrics)
    torch.testing.assert_close(loss, metrics["action"] + metrics["return"] + metrics["state"])
    loss.backward()
    assert model.next_state_head.weight.grad.abs().sum() > 0


def test_image_observations_through_the_cnn_encoder():
    space = gym.spaces.Box(0, 255, (4, 8, 8), np.uint8)
    model = build_decision_transformer(
        space, gym.spaces.Discrete(3), dim=16, heads=1, context=3
    ).eval()
    state = model.initial_state(2, torch.tensor([1.0, 2.0]))
    frames = np.random.default_rng(0).integers(0, 256, (2, 4, 8, 8), dtype=np.uint8)
    (action, *_), state = model.act(frames, state, np.ones(2, bool))
    assert action.shape == (2,) and state.states.dtype == torch.uint8
    assert model.state_mean.shape == ()  # images are scaled by the encoder, not standardised


@pytest.mark.parametrize("space", [DISCRETE, BOX], ids=["discrete", "continuous"])
def test_overfits_a_few_fixed_windows(space):
    torch.manual_seed(0)
    model = make_dt(space, dim=32).train()
    batch = random_batch(space, b=4, pad=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(100):
        loss, _ = model.loss(batch)
        first = loss.item() if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first


# ------------------------------------------------------------------------------ BC


def make_bc(space: gym.Space = DISCRETE, history: int = 3) -> BehaviorCloning:
    kw = {"dim": 16, "layers": 2, "history": history, "dropout": 0.0, "stats": STATS}
    return BehaviorCloning(OBS, space, **kw)


@pytest.mark.parametrize("space", [DISCRETE, BOX], ids=["discrete", "continuous"])
def test_bc_shapes_loss_and_history(space):
    h = 3
    model = make_bc(space, h).eval()
    batch = random_batch(space)
    pred = model(batch)
    assert pred.shape == (3, K, 4 if space is DISCRETE else 2)
    loss, metrics = model.loss(batch)
    assert torch.isfinite(loss) and "action" in metrics
    # Returns and actions are ignored; step t sees exactly the states t-h+1..t.
    other = replace(batch, returns_to_go=-batch.returns_to_go, actions=batch.actions.flip(1))
    torch.testing.assert_close(model(other), pred)
    t = 1
    states = batch.states.clone()
    states[:, t] += 4.0
    out = model(replace(batch, states=states))
    torch.testing.assert_close(out[:, :t], pred[:, :t])
    assert not torch.allclose(out[:, t : t + h], pred[:, t : t + h], atol=1e-6)
    torch.testing.assert_close(out[:, t + h :], pred[:, t + h :])


def test_bc_acting_ignores_target_and_matches_forward():
    model = make_bc(history=K).eval()
    t_len = K + 3
    g = torch.Generator().manual_seed(6)
    obs = torch.randn(t_len, 1, 3, generator=g)
    rewards = torch.ones(t_len, 1)
    done = torch.zeros(t_len, 1, dtype=torch.bool)
    done[0] = True
    low, act_low, _ = rollout(model, obs, rewards, torch.tensor([0.0]), done)
    high, _, _ = rollout(model, obs, rewards, torch.tensor([1e3]), done)
    torch.testing.assert_close(low, high)
    batch = windows_by_hand(obs[:, 0], act_low[:, 0], rewards[:, 0], 0.0, K)
    torch.testing.assert_close(low[:, 0], model(batch)[:, -1])


def test_cartpole_data_to_vector_env_evaluation_with_per_env_targets():
    """Buffer -> DT loss -> acting in a SAME_STEP vector env, one target per env: after each
    episode end an env restarts from its own target with a one-step context."""
    from rltrans.buffers.trajectory import TrajectoryBuffer
    from rltrans.envs.offline import OfflineDataset
    from rltrans.runtime.collection import collect_episodes

    env = gym.make("CartPole-v1")
    episodes = collect_episodes("CartPole-v1", None, episodes=6, num_envs=2, progress=False)
    ds = OfflineDataset(episodes, env.observation_space, env.action_space)
    buffer = TrajectoryBuffer(ds, context=4)
    model = build_decision_transformer(
        buffer.observation_space, ds.action_space, dim=16, heads=1, context=4, stats=buffer.stats()
    )
    loss, _ = model.loss(buffer.sample(8))
    loss.backward()
    model.eval()

    targets = torch.tensor([10.0, 20.0, 40.0])
    envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1")] * 3,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    obs, _ = envs.reset(seed=0)
    state = model.initial_state(3, targets)
    done = np.ones(3, dtype=bool)
    ends = 0
    for _ in range(60):
        (action, *_), state = model.act(obs, state, done)
        if done.any():  # fresh episodes: one real step, conditioned on their own target
            assert (state.valid[done] == 1).all()
            assert torch.equal(state.returns_to_go[done, -1], targets[done])
        obs, reward, term, trunc, _ = envs.step(action.numpy())
        state = model.observe(state, reward)
        done = term | trunc
        ends += int(done.sum())
    assert ends > 0  # random-ish CartPole episodes end within 60 steps
    envs.close()


@pytest.mark.parametrize("space", [DISCRETE, BOX], ids=["discrete", "continuous"])
def test_state_outputs_equal_the_full_forward_at_state_tokens(space):
    """The pruned training path (no last action token, last layer at state tokens only) gives
    the full stack's s_t outputs, with padding."""
    model = make_dt(space, layers=3)
    batch = random_batch(space, pad=2)
    torch.testing.assert_close(model.state_outputs(batch), model.hidden(batch)[:, :, 1])


# ------------------------------------------------------------------------------ builders


def test_the_model_takes_a_built_backbone_and_the_builder_maps_the_knobs():
    """build_decision_transformer turns dt.yaml's knobs into a BlockConfig and a backbone;
    the class itself takes the built backbone (any width: the model's is the backbone's)."""
    model = make_dt(position="learned", gate="gru", norm="post", activation="gelu", kernel="math")
    config = model.transformer.config
    assert (config.dim, config.heads, config.position, config.gate) == (16, 2, "learned", "gru")
    assert (config.norm, config.ff_activation, config.kernel) == ("post", "gelu", "math")
    assert config.max_len == 3 * K and config.sublayer_activation == "none"
    assert (config.dropout, config.attn_dropout) == (0.0, 0.0)
    assert model.prunes_to_states and model.transformer.layers == 2
    stack = causal_stack(gpt2_config(dim=8, heads=2, max_len=3 * K), layers=1)
    direct = DecisionTransformer(OBS, DISCRETE, stack, context=K, stats=STATS)
    assert direct.dim == 8 and direct.transformer is stack
    assert direct.embed_drop.p == 0.1  # GPT-2's embedding dropout: the backbone's dropout
    assert direct(random_batch()).shape == (3, K, 4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'layer'"):
        build_decision_transformer(OBS, DISCRETE, layer=3)


def test_the_universal_backbone_gets_the_dt_knobs():
    model = make_dt(backbone="universal", max_steps=3, activation="relu", coordinate_scale=0.2)
    ut = model.transformer
    assert ut.ponders and not model.prunes_to_states
    assert ut.max_steps == 3 and ut.coordinate_scale == 0.2
    assert ut.config.ff_activation == "relu" and ut.config.max_len == 3 * K
    assert isinstance(ut.block.mlp.net[1], torch.nn.ReLU)


@pytest.mark.parametrize("backbone", ["causal", "universal"])
def test_the_builder_equals_the_model_built_on_its_spec(backbone):
    """The knobs become a CausalSpec or UniversalSpec; the model on that spec's backbone is
    the builder's, weight for weight (same seed)."""
    from rltrans.backbones.spec import CausalSpec, UniversalSpec, build

    config = gpt2_config(16, 2, dropout=0.0, ff_activation="relu", max_len=3 * K)
    spec = CausalSpec(config, layers=2) if backbone == "causal" else UniversalSpec(config, 0, 4)
    options = {"coordinate_scale": 1.0} if backbone == "universal" else {}
    torch.manual_seed(0)
    built = make_dt(backbone=backbone, max_steps=4, **options)
    torch.manual_seed(0)
    direct = DecisionTransformer(OBS, DISCRETE, build(spec), context=K, stats=STATS).eval()
    want, got = built.state_dict(), direct.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
