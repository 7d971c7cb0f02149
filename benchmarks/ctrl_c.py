"""How long Ctrl-C takes to stop a training run: SIGINT to the run's process group (as a
terminal sends it) at given seconds into the run, and the seconds from the signal to the exit,
its exit code and the line it printed. The default run is the passive T-maze at corridor
1,000, whose updates (rollouts of 1,024 steps) take seconds each.

    python benchmarks/ctrl_c.py 30 100
    python benchmarks/ctrl_c.py 60 --run env=gym env.id=CartPole-v1
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

RUN = ["env=passive_tmaze", "env.kwargs.length=1000", "total_steps=1200000"]


def main() -> None:
    """One run per time given; a line each."""
    raw = argparse.RawTextHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("at", nargs="+", type=float, help="seconds into the run to send SIGINT")
    parser.add_argument("--run", nargs="*", default=RUN, help="the run's overrides")
    args = parser.parse_args()
    # A job started in the background of a script has SIGINT ignored, and its children
    # inherit that: give the runs a terminal job's default.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    env = {**os.environ, "RLTRANS_PROGRESS_EVERY_S": "0"}  # a progress line per update
    for at in args.at:
        with tempfile.TemporaryDirectory() as folder, open(f"{folder}/err", "w+") as err:
            command = [sys.executable, "-m", "rltrans.train", *args.run, f"run_dir={folder}/run"]
            proc = subprocess.Popen(
                [*command, "progress=true"], stdout=subprocess.PIPE, stderr=err, text=True,
                start_new_session=True, env=env,
            )  # fmt: skip
            time.sleep(at)
            start = time.monotonic()
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate()
            took = time.monotonic() - start
            err.seek(0)
            lines = err.read().splitlines()
        updates = sum(line.startswith("train:") for line in lines)
        said = next((line for line in lines if line.startswith("rltrans: SIGINT")), "")
        print(f"at {at:g} s: exit {proc.returncode}, {took:.1f} s after the signal, "
              f"{updates} progress lines; {said}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
