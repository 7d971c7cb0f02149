"""What several test folders share: the tiny command-line configs and the summary line
(``cli``), the hostile-input fuzzers' settings and limits (``hostile``), a user's Gymnasium env
(``user_envs``) and the env wrapper that kills its own training (``kill``)."""
