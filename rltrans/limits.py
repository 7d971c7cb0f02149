"""Size limits of config values, far above any real run and far below what would exhaust
memory before the resource estimate (``rltrans.config.resources``) runs: a file's
``agent.dim: 1e8`` stops at the check. A leaf module, so the typed settings of any layer
can state their ranges with them.
"""

MAX_WIDTH = 2**16  # model widths, heads
MAX_LAYERS = 1024  # stacked or looped blocks
MAX_LENGTH = 2**20  # windows, memories, contexts, rollout lengths, episode lengths
MAX_ENVS = 2**20  # parallel envs, batch sizes
MAX_STEPS = 10**15  # budgets in env or gradient steps (int64 step counters and logs)
MAX_EPISODES = 10**7  # evaluation episodes
MAX_SPACE_SIZE = 2**26  # elements of one space: a wrapper's shape, a checkpoint's (8K RGB: 2^25)
