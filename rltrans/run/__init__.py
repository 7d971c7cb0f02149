"""The run layer: what one training run owns from its start to its end.

* :mod:`rltrans.run.context`: the run context every trainer shares (device, threads,
  seeding, the saved config, the checkpoint payload, resume, the summary line);
* :mod:`rltrans.run.folder`: which folders a run may take, its lock, writes never through
  a link;
* :mod:`rltrans.run.checkpoint`: checkpoint files that ``torch.load(weights_only=True)``
  reads back;
* :mod:`rltrans.run.saved_state`: the checks of the trainer state a checkpoint holds;
* :mod:`rltrans.run.rng`: the random generators' state, saved and restored;
* :mod:`rltrans.run.logging`: TensorBoard, CSV and the console;
* :mod:`rltrans.run.progress`: the progress bar.

It sits above the config (which knows no run) and below the trainers, the actors and the
policy loader. This ``__init__`` imports nothing, so reading a checkpoint does not start a run.
"""
