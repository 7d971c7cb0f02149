"""Decision Transformer with the Universal Transformer backbone (agent=dt agent.backbone=universal):
the DT invariants hold unchanged, and ACT's ponder cost joins the loss."""

import pytest
import torch

import tests.agents.test_dt as dt_tests
from rltrans.train import main as train_main

_make_dt = dt_tests.make_dt


@pytest.fixture
def universal(monkeypatch):
    """Run the DT tests' model builder with the universal backbone."""

    def make(action_space=dt_tests.DISCRETE, **kw):
        return _make_dt(action_space, backbone="universal", max_steps=3, **kw)

    monkeypatch.setattr(dt_tests, "make_dt", make)
    return make


def test_causality_and_token_order(universal):
    dt_tests.test_prediction_t_sees_returns_states_to_t_and_actions_before_t(dt_tests.DISCRETE)


def test_padding_does_not_leak(universal):
    dt_tests.test_padded_steps_do_not_influence_real_outputs(dt_tests.BOX)


def test_acting_equals_batched_forward(universal):
    dt_tests.test_acting_equals_batched_forward_on_the_same_trajectory(dt_tests.DISCRETE)


def test_ponder_cost_joins_the_loss_and_reaches_the_halting_unit(universal):
    model = universal(tau=0.5).train()
    batch = dt_tests.random_batch(pad=2)
    loss, metrics = model.loss(batch)
    assert 1.0 <= metrics["ponder"].item() <= 3.0 + 1.0  # N + R with N in [1, max_steps]
    no_ponder = universal(tau=0.0)
    no_ponder.load_state_dict(model.state_dict())
    plain, _ = no_ponder.train().loss(batch)
    torch.testing.assert_close(loss - plain, 0.5 * metrics["ponder"])
    loss.backward()
    unit = model.transformer.halting.unit
    assert unit.weight.grad.abs().sum() > 0 and unit.bias.grad.abs().sum() > 0


def test_unknown_dt_backbone_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown DT backbone 'rnn'; valid choices: causal"):
        _make_dt(backbone="rnn")


def test_cli_trains_dt_with_universal_backbone(tmp_path, monkeypatch, capsys):
    from rltrans.envs.minari_data import write_minari
    from rltrans.runtime.collection import collect_episodes

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    episodes = collect_episodes("CartPole-v1", None, episodes=6, seed=0, progress=False)
    write_minari(
        "rltrans/cp-ut-v0",
        episodes,
        env="CartPole-v1",
        algorithm_name="random",
        author="tests",
        description="tiny random CartPole data",
    )
    args = [
        "agent=dt",
        "agent.backbone=universal",
        "agent.dim=16",
        "agent.context=4",
        "dataset=rltrans/cp-ut-v0",
        "train_steps=3",
        "algo.eval_episodes=0",
        "algo.batch_size=4",
        f"run_dir={tmp_path / 'run'}",
        "progress=false",
    ]
    assert train_main(args) == 0
    assert '"status": "finished"' in capsys.readouterr().out
