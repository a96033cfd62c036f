"""tito GRPO trainer: rollouts against the env server, ids appended verbatim, never re-tokenized."""
