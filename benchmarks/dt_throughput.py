"""Decision Transformer training throughput: rltrans vs HuggingFace, tokens per second.

The paper's Gym configuration (Chen et al. 2021, appendix A): batch 64, context K = 20 (3K =
60 tokens per window), 128-dim, 3 layers, 1 head, dropout 0.1, on Hopper-sized data (11-dim
states, 3-dim Box actions in [-1, 1], timestep embedding of 1000). One training step is forward,
masked MSE action loss, backward, gradient clipping at 0.25 and AdamW. Both models get the
same pre-generated batches (data loading is not timed; ``rltrans+sampling`` adds
`TrajectoryBuffer.sample` for the full picture) and the same optimizer (fused AdamW).

The reference is ``transformers.DecisionTransformerModel`` (HF's port of the DT code: GPT-2
with ReLU MLP, per-modality embeddings), measured in the same process, interleaved with
rltrans in every round so that load on the machine hits both alike. On CPU the clock is the
process's CPU time with one torch thread (default), so other jobs on a shared machine do not
count. Then a breakdown of where each step's time goes: forward / backward / optimizer per
step, ablation rows (``--ablations``: the core's GELU instead of DT's ReLU, the loss through
every token's output instead of the state tokens' alone, both models without any dropout),
and torch.profiler's top ops.

    python benchmarks/dt_throughput.py [--steps 20] [--rounds 3] [--pairs 100] [--threads 1]
                                       [--device cpu] [--amp]

``--amp`` (CUDA only) runs every row's forward and loss under bfloat16 autocast, as offline
training does with ``algo.amp=true``; the optimizer state stays fp32.

``--pairs`` adds the paired estimate (see :func:`paired`), the one to quote on a shared
machine: each trainer row's median per-step ratio to HF over that many turns.

If ``transformers`` is not installed (``pip install -e ".[bench]"``) the script measures
rltrans alone and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F

from rltrans.accel.compile import compiled
from rltrans.agents.dt import build_decision_transformer
from rltrans.buffers.trajectory import TrajectoryBatch, TrajectoryBuffer, TrajectoryStats
from rltrans.envs.offline import Episode, OfflineDataset
from rltrans.learners import Learner, OptimizerConfig

STATE_DIM, ACT_DIM, MAX_EP_LEN = 11, 3, 1000  # Hopper-v3 sizes, as in the paper's Gym runs
CLOCK = time.process_time  # CPU: this process's CPU time; CUDA runs switch to wall time
AMP = False  # --amp: bfloat16 autocast around every forward and loss (CUDA only)


def autocast() -> contextlib.AbstractContextManager:
    """bfloat16 autocast for a forward and loss with ``--amp``, else nothing."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if AMP else contextlib.nullcontext()


def make_batches(n: int, b: int, k: int, device: torch.device) -> list[TrajectoryBatch]:
    """Random full windows (no padding) of the benchmark shape."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        start = torch.randint(0, MAX_EP_LEN - k, (b, 1), generator=g)
        batch = TrajectoryBatch(
            states=torch.randn(b, k, STATE_DIM, generator=g),
            actions=torch.rand(b, k, ACT_DIM, generator=g) * 2 - 1,
            returns_to_go=torch.rand(b, k, 1, generator=g) * 3000,
            timesteps=start + torch.arange(k),
            mask=torch.ones(b, k, dtype=torch.bool),
        )
        out.append(batch.to(device))
    return out


class Runner:
    """One implementation's training step, split in timed phases."""

    def __init__(self, name: str, forward_loss: Callable, model: torch.nn.Module, clip: float):
        self.name, self.forward_loss, self.model = name, forward_loss, model
        self.optimizer = torch.optim.AdamW(
            model.parameters(), lr=1e-4, weight_decay=1e-4, fused=True
        )
        self.clip = clip
        self.phases = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}

    def step(self, batch: TrajectoryBatch, sync: Callable[[], None]) -> None:
        """Forward + loss, backward, clip + AdamW; adds each phase's seconds to self.phases."""
        t0 = CLOCK()
        with autocast():
            loss = self.forward_loss(batch)
        sync()
        t1 = CLOCK()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sync()
        t2 = CLOCK()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        sync()
        t3 = CLOCK()
        self.phases["forward"] += t1 - t0
        self.phases["backward"] += t2 - t1
        self.phases["optimizer"] += t3 - t2


def rltrans_runner(args, device, name: str = "rltrans", **options) -> Runner:
    """rltrans DecisionTransformer at the paper config (configs/agent/dt.yaml defaults)."""
    obs = gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32)
    act = gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32)
    stats = TrajectoryStats(torch.zeros(STATE_DIM), torch.ones(STATE_DIM), 1000.0, MAX_EP_LEN)
    model = build_decision_transformer(
        obs,
        act,
        dim=128,
        layers=3,
        heads=1,
        context=args.context,
        stats=stats,
        **{"dropout": 0.1, **options},
    ).to(device)
    model.train()
    return Runner(name, lambda batch: model.loss(batch)[0], model, 0.25)


class TrainerRunner(Runner):
    """rltrans' offline trainer step: :class:`rltrans.learners.Learner` (fused AdamW, the
    clipping and the schedule) on the eager or the compiled loss (``compile=true``,
    and what ``compile=auto`` picks for any run long enough to pay the compile back)."""

    def __init__(self, name: str, runner: Runner, compile: bool) -> None:
        model = runner.model
        device = next(model.parameters()).device
        loss = compiled(model.loss, device=device) if compile else model.loss
        super().__init__(name, lambda batch: loss(batch)[0], model, 0.25)
        self.optimizer = None  # the learner's
        optim = OptimizerConfig(lr=1e-4, anneal_lr=False, max_grad_norm=0.25, weight_decay=1e-4)
        self.learner = Learner(model, optim, total_updates=10**6)

    def step(self, batch: TrajectoryBatch, sync: Callable[[], None]) -> None:
        """Forward + loss, then the learner's backward, clip and AdamW (timed as backward)."""
        t0 = CLOCK()
        with autocast():
            loss = self.forward_loss(batch)
        sync()
        t1 = CLOCK()
        self.learner.step(loss)
        sync()
        t2 = CLOCK()
        self.phases["forward"] += t1 - t0
        self.phases["backward"] += t2 - t1


def full_stack(runner: Runner) -> Runner:
    """Ablation: the loss through every token's output (no pruning of the last action token
    and of the last layer's non-state queries), i.e. what the model computed before."""
    model = runner.model

    def forward_loss(batch: TrajectoryBatch) -> torch.Tensor:
        action = model.action_codec(model.hidden(batch)[:, :, 1])
        return model.action_codec.loss(action, batch.actions, batch.mask)[0]

    runner.forward_loss = forward_loss
    return runner


def ablations(args, device, reference: Runner | None) -> list[Runner]:
    """Rows that show where rltrans's time goes relative to the reference."""
    rows = [
        rltrans_runner(args, device, "  rltrans, GELU MLP", activation="gelu"),
        full_stack(rltrans_runner(args, device, "  rltrans, every token's output")),
        rltrans_runner(args, device, "  rltrans, no dropout", dropout=0.0),
    ]
    if reference is not None:
        no_drop = hf_runner(args, device, dropout=0.0)
        no_drop.name = "  HF, no dropout"
        rows.append(no_drop)
    return rows


def hf_runner(args, device, dropout: float = 0.1) -> Runner | None:
    """transformers.DecisionTransformerModel with the same sizes, or None if not installed."""
    try:
        import transformers
        from transformers import DecisionTransformerConfig, DecisionTransformerModel
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    config = DecisionTransformerConfig(
        state_dim=STATE_DIM,
        act_dim=ACT_DIM,
        hidden_size=128,
        n_layer=3,
        n_head=1,
        n_inner=4 * 128,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        max_ep_len=MAX_EP_LEN,
        action_tanh=True,
    )
    model = DecisionTransformerModel(config).to(device)
    model.train()

    def forward_loss(batch: TrajectoryBatch) -> torch.Tensor:
        # HF's training example: states pre-normalised, returns-to-go pre-scaled, mask as float.
        out = model(
            states=batch.states,
            actions=batch.actions,
            returns_to_go=batch.returns_to_go / 1000.0,
            timesteps=batch.timesteps,
            attention_mask=batch.mask.float(),
            return_dict=True,
        )
        pred = out.action_preds[batch.mask]  # (B*K, A) real steps
        return F.mse_loss(pred, batch.actions[batch.mask])

    runner = Runner("HF transformers", forward_loss, model, 0.25)
    runner.attn = model.config._attn_implementation  # type: ignore[attr-defined]
    runner.version = transformers.__version__  # type: ignore[attr-defined]
    return runner


def sampling_runner(args, device, base: Runner) -> tuple[Runner, Callable]:
    """rltrans with a TrajectoryBuffer.sample in each step (Hopper-sized synthetic episodes)."""
    rng = np.random.default_rng(0)
    episodes = [
        Episode(
            rng.standard_normal((MAX_EP_LEN, STATE_DIM)).astype(np.float32),
            rng.uniform(-1, 1, (MAX_EP_LEN, ACT_DIM)).astype(np.float32),
            rng.random(MAX_EP_LEN).astype(np.float32),
        )
        for _ in range(100)
    ]
    data = OfflineDataset(
        episodes,
        gym.spaces.Box(-np.inf, np.inf, (STATE_DIM,), np.float32),
        gym.spaces.Box(-1.0, 1.0, (ACT_DIM,), np.float32),
    )
    buffer = TrajectoryBuffer(data, args.context, seed=0)
    runner = Runner("rltrans+sampling", base.forward_loss, base.model, 0.25)
    runner.optimizer = base.optimizer
    return runner, lambda: buffer.sample(args.batch, device=device)


def profile_top_ops(runner: Runner, batch: TrajectoryBatch, steps: int, rows: int) -> str:
    """torch.profiler's top ops by self CPU time over a few steps of one implementation."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if batch.mask.is_cuda:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(steps):
            runner.step(batch, lambda: None)
    sort = "self_cuda_time_total" if batch.mask.is_cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=40)


def rotated(rows: list[Runner], k: int) -> list[Runner]:
    """rows started at index k mod len(rows): the order of round or turn k."""
    return rows[k % len(rows) :] + rows[: k % len(rows)]


def paired(
    rows: list[Runner],
    reference: Runner,
    batches: list[TrajectoryBatch],
    turns: int,
    sync: Callable[[], None],
) -> str:
    """Median and quartiles of each row's per-turn speed ratio to the reference.

    One turn is one step of every row and of the reference, back to back, in an order that
    rotates; each row's ratio is taken within the turn. A slow spell of the machine then
    slows both sides of a ratio, so the median over many turns moves far less between runs
    than a ratio of block medians (measured: 1.46-1.50x over five runs of 150 turns for the
    compiled row, while block medians of the same code gave 1.37-1.79x over three runs).
    """
    ratios: dict[str, list[float]] = {r.name: [] for r in rows}
    everyone = [*rows, reference]
    for turn in range(turns):
        seconds = {}
        for r in rotated(everyone, turn):
            t0 = CLOCK()
            r.step(batches[turn % len(batches)], sync)
            seconds[r.name] = CLOCK() - t0
        for r in rows:
            ratios[r.name].append(seconds[reference.name] / seconds[r.name])
    lines = [f"\npaired: one step of each in turn, {turns} turns; median ratio to HF (quartiles)"]
    for r in rows:
        q1, median, q3 = np.percentile(ratios[r.name], [25, 50, 75])
        lines.append(f"  {r.name:28s} {median:.2f}x  ({q1:.2f}-{q3:.2f})")
    return "\n".join(lines)


def main() -> None:
    """Measure, print the table, the ratio and the breakdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads; 0 = default")
    parser.add_argument("--ablations", action="store_true", help="add the ablation rows")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA only)")
    parser.add_argument(
        "--no-compile", action="store_true", help="leave out the compiled trainer row"
    )
    parser.add_argument("--profile-steps", type=int, default=5, help="0 = no profiler tables")
    parser.add_argument(
        "--pairs",
        type=int,
        default=100,
        help="paired estimate: single steps of the trainer rows and HF in turn, this many "
        "times; the median of the per-turn ratios (0 = skip)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.amp and device.type != "cuda":
        parser.error(f"--amp needs a CUDA --device (got {args.device!r}); training ignores "
                     "algo.amp on CPU too")  # fmt: skip
    torch.manual_seed(0)
    global CLOCK, AMP
    AMP = args.amp
    if device.type == "cuda" or torch.get_num_threads() > 1:
        CLOCK = time.perf_counter  # CPU time would add up the threads

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    ours = rltrans_runner(args, device)
    reference = hf_runner(args, device)
    sampled, sample = sampling_runner(args, device, ours)
    extra = ablations(args, device, reference) if args.ablations else []
    # Rows in print order; the ablations of each implementation follow it.
    trainer = [TrainerRunner("rltrans trainer, eager", rltrans_runner(args, device), False)]
    if not args.no_compile:
        compiled_ = TrainerRunner("rltrans trainer, compiled", rltrans_runner(args, device), True)
        trainer.append(compiled_)
    rows = [ours, *trainer, sampled, *[r for r in extra if "HF" not in r.name]]
    if reference is not None:
        rows += [reference, *[r for r in extra if "HF" in r.name]]
    batches = make_batches(4, args.batch, args.context, device)
    tokens = args.batch * 3 * args.context  # per step
    print(
        f"DT training throughput | batch {args.batch}, K {args.context} ({3 * args.context} "
        f"tokens/window), 128-dim, 3 layers, 1 head, dropout 0.1 | device {device} | torch "
        f"{torch.__version__}, {torch.get_num_threads()} threads | clock: "
        f"{'process CPU time' if CLOCK is time.process_time else 'wall time'}"
        f"{' | bfloat16 autocast' if AMP else ''}"
    )
    if reference is None:
        print("reference: transformers is NOT installed (pip install -e '.[bench]'); rltrans only")
    else:
        print(f"reference: transformers {reference.version} DecisionTransformerModel, "
              f"attention implementation {reference.attn!r}")  # fmt: skip

    def run(r: Runner, steps: int) -> None:
        for i in range(steps):
            r.step(sample() if r is sampled else batches[i % 4], sync)

    for r in rows:  # warm-up: allocator, kernels, optimizer state
        run(r, 3)
        r.phases = dict.fromkeys(r.phases, 0.0)
    per_round: dict[str, list[float]] = {r.name: [] for r in rows}
    for k in range(args.rounds):  # interleaved, so a busy spell hits every row alike
        # The order rotates each round and every row gets one untimed step first: the row
        # that runs right after another model pays for re-growing the allocator's heap (that
        # alone cost the first row ~10 % in a fixed order).
        for r in rotated(rows, k):
            phases = dict(r.phases)
            run(r, 1)
            r.phases = phases
            t0 = CLOCK()
            run(r, args.steps)
            per_round[r.name].append(args.steps * tokens / (CLOCK() - t0))

    print(f"\n{'implementation':30s} {'params':>8s} {'tokens/s':>9s} {'steps/s':>8s} "
          f"{'fwd ms':>7s} {'bwd ms':>7s} {'opt ms':>7s}")  # fmt: skip
    total_steps = args.rounds * args.steps
    for r in rows:
        rate = statistics.median(per_round[r.name])
        ms = {k: 1e3 * v / total_steps for k, v in r.phases.items()}
        n = sum(p.numel() for p in r.model.parameters())
        print(f"{r.name:30s} {n:8d} {rate:9.0f} {rate / tokens:8.2f} "
              f"{ms['forward']:7.1f} {ms['backward']:7.1f} {ms['optimizer']:7.1f}")  # fmt: skip
    if reference is not None:
        hf = statistics.median(per_round[reference.name])
        print(f"\nratios to HF transformers (tokens/s, median of {args.rounds} rounds; then the"
              " ratio within each round, lowest to highest: the machine's spread)")  # fmt: skip
        for r in [ours, *trainer]:
            rounds = zip(per_round[r.name], per_round[reference.name], strict=True)
            within = sorted(a / b for a, b in rounds)
            spread = ", ".join(f"{x:.2f}" for x in within)
            print(f"  {r.name:28s} {statistics.median(per_round[r.name]) / hf:.2f}x  ({spread})")
        if args.pairs:
            print(paired(trainer, reference, batches, args.pairs, sync))
        if not args.no_compile:
            print("  (offline training's compile=auto compiles a run long enough to pay the"
                  " compile back and keeps it only if it is >= 5 % faster than eager)")  # fmt: skip
    if args.profile_steps:
        for r in [ours] if reference is None else [ours, reference]:
            print(f"\n== top ops by self time, {r.name} ({args.profile_steps} steps) ==")
            print(profile_top_ops(r, batches[0], args.profile_steps, rows=12))


if __name__ == "__main__":
    main()
