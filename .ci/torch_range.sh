#!/usr/bin/env bash
# The torch range that CI tests besides .ci/run's pinned CPU build: the floor of the range that
# pyproject.toml admits and the newest torch the registry serves. Each gets a job: a fresh venv
# with that torch, then rltrans (editable, [dev]), then
#   1. the core tests (CORE_TESTS below);
#   2. a short PPO run with compile=true (compiled loss and acting step);
#   3. a small Minari dataset and a few offline Decision Transformer steps with compile=true;
#   4. the acting path: evaluate the PPO and the DT checkpoints.
# A job's venv, runs, dataset and Inductor cache are deleted when it ends. Every job runs, then
# the script fails (non-zero) if any job failed, naming them.
#
#   bash .ci/torch_range.sh              # the floor and the newest
#   bash .ci/torch_range.sh 2.6.0 2.8.0  # these versions
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_FLOOR=2.4.1    # the floor of pyproject.toml's torch range (keep the two in sync)
TORCH_NEWEST=2.14.1  # the newest, used when pip cannot ask the registry (see newest_torch)
TORCH_PINNED=2.13.0  # .ci/run's own build, not repeated here
# The core tests: the attention core, backbones, agents, losses, returns and buffers (~40 s).
CORE_TESTS=(tests/core tests/backbones tests/agents tests/losses tests/buffers
    tests/test_returns.py)
LIMIT=600            # seconds for each command of a job (a hang fails the job, not CI's clock)

SECONDS=0
step() { printf '\n=== [%3ds] %s\n' "$SECONDS" "$*"; }
WORK="$(mktemp -d "${TMPDIR:-/tmp}/rltrans-torch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

# pyproject.toml's torch requirement, e.g. torch>=2.4,<2.15 (plain torch if none is found).
torch_spec() {
    grep -oE '"torch *[<>=!~][^"]*"' pyproject.toml | head -1 | tr -d '" ' || echo torch
}

# What `pip install torch` picks here within pyproject.toml's range: the newest release that the registry serves and this
# machine's pip configuration allows (a constraint file may cap it); the fallback otherwise.
newest_torch() {
    local version
    version="$(timeout 120 python3 -m pip install --dry-run --no-deps --ignore-installed -q \
        --report - "$(torch_spec)" 2>/dev/null | python3 -c \
        'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])' \
        2>/dev/null)" || version=""
    echo "${version:-$TORCH_NEWEST}"
}

# One job: the checks above on torch==$1, in $WORK/torch-$1. Runs under `set -e`.
torch_job() {
    local version="$1" dir="$WORK/torch-$1"
    local py="$dir/venv/bin/python" start=$SECONDS
    # Each command under the time limit, on one thread, with its own Inductor cache and datasets.
    run() {
        timeout "$LIMIT" env OMP_NUM_THREADS=1 TORCHINDUCTOR_CACHE_DIR="$dir/inductor" \
            MINARI_DATASETS_PATH="$dir/minari" "$py" "$@"
    }

    # pip's output goes to a log, shown when an install fails.
    install() {
        "$py" -m pip install -q "$@" >>"$dir/pip.log" 2>&1 || { cat "$dir/pip.log"; return 1; }
    }

    step "torch $version: fresh venv, torch==$version, then -e .[dev]"
    python3 -m venv "$dir/venv"
    install --upgrade pip
    # A CPU wheel where the registry has one; else the default (CUDA) wheel, which runs on CPU.
    install "torch==$version"
    install -e ".[dev]"
    # Installing rltrans must not have moved torch (as it would to meet pyproject.toml's range).
    "$py" - "$version" <<'EOF'
import sys, torch
print("torch", torch.__version__)
if torch.__version__.split("+")[0] != sys.argv[1].split("+")[0]:
    sys.exit(f"installing rltrans replaced torch {sys.argv[1]} by {torch.__version__}")
EOF

    step "torch $version: core tests"
    run -m pytest -q -p no:cacheprovider "${CORE_TESTS[@]}"

    step "torch $version: PPO, compile=true"
    run -m rltrans.train total_steps=2048 agent.dim=32 agent.layers=1 agent.memory=8 \
        compile=true torch_threads=1 progress=false tensorboard=false run_dir="$dir/ppo"
    test -f "$dir/ppo/checkpoints/last.pt"

    step "torch $version: a small Minari dataset, then the Decision Transformer, compile=true"
    run -m rltrans.collect dataset_id=rltrans/ci-cartpole-v0 env_id=CartPole-v1 \
        policy=rltrans.envs.scripted:CartPoleController "epsilon=[0,1]" episodes=10 \
        progress=false torch_threads=1
    run -m rltrans.train agent=dt dataset=rltrans/ci-cartpole-v0 train_steps=30 agent.dim=32 \
        agent.layers=1 agent.context=8 algo.batch_size=8 algo.log_every=10 \
        algo.eval_episodes=1 algo.eval_num_targets=1 compile=true torch_threads=1 \
        progress=false tensorboard=false run_dir="$dir/dt"
    test -f "$dir/dt/checkpoints/last.pt"

    step "torch $version: acting (evaluate both checkpoints)"
    run -m rltrans.evaluate checkpoint="$dir/ppo" episodes=2 torch_threads=1
    run -m rltrans.evaluate checkpoint="$dir/dt" episodes=1 torch_threads=1

    step "torch $version: passed in $((SECONDS - start)) s"
}

if [ $# -gt 0 ]; then
    versions=("$@")
else
    # The floor tested here is the one pyproject.toml states ("torch>=2.4" for 2.4.1).
    bound="$(grep -oE '"torch *>= *[0-9.]+' pyproject.toml | grep -oE '[0-9.]+$' || true)"
    case "$TORCH_FLOOR" in
        "$bound" | "$bound".*) ;;
        *) echo "pyproject.toml's torch bound '>=$bound' is not TORCH_FLOOR=$TORCH_FLOOR" >&2
           exit 1 ;;
    esac
    newest="$(newest_torch)"
    versions=("$TORCH_FLOOR")
    if [ "$newest" != "$TORCH_FLOOR" ] && [ "$newest" != "$TORCH_PINNED" ]; then
        versions+=("$newest")
    fi
    step "torch range: floor $TORCH_FLOOR, newest served $newest (pinned $TORCH_PINNED: .ci/run)"
fi

failed=()
for version in "${versions[@]}"; do
    # A subshell with its own `set -e` (a function called in a condition would run without it),
    # so that one job's failure stops that job only.
    set +e
    (set -e; torch_job "$version")
    status=$?
    set -e
    rm -rf "$WORK/torch-$version"
    if [ "$status" -ne 0 ]; then
        step "torch $version: FAILED (exit $status)"
        failed+=("$version")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "torch range: failed on torch ${failed[*]}" >&2
    exit 1
fi
step "torch range passed: ${versions[*]}"
