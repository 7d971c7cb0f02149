"""python -m rltrans.train [group=option ...] [key=value ...]   (--help lists every knob)

Online training (algo=ppo|impala) and offline training of return-conditioned policies
(agent=dt|bc, dataset=<id>) share one run context (rltrans.run.context) and read top to bottom in
rltrans.trainers.ppo, .impala and .offline. Prints one JSON summary line at the end. From
Python, the same run is ``rltrans.learn(rltrans.plan(...))`` (rltrans.api).
"""

from __future__ import annotations

import sys
from typing import Any

from omegaconf import DictConfig

from rltrans.cli import run_cli


def main(argv: list[str] | None = None) -> int:
    """Entry point: resolve the run plan, train, print one JSON summary line."""
    argv = list(sys.argv[1:] if argv is None else argv)

    def run(cfg: DictConfig) -> dict[str, Any]:
        from rltrans.api import learn, resolve

        return learn(resolve(cfg, argv))  # the same two calls as from Python

    return run_cli(argv, "train", __doc__, run)


if __name__ == "__main__":
    sys.exit(main())
