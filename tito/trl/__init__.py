"""tito for TRL's GRPOTrainer (trl>=1.16,<1.17: `pip install 'tito[trl]'`), through either door.

- `TitoRollout` (primary): a ready `rollout_func`. tito renders prompts and tool suffixes and runs
  the tools, the trainer's own model or TRL's vLLM generates; every tito guarantee is kept.
- `TitoEnvironmentSpec` (secondary): an `environment_factory` for TRL's own tool loop, in the
  shape of `trl.experimental.openreward`; TRL renders and parses, tito only runs the tools.

Both TRL APIs are experimental in 1.16 and warn unless `TRL_EXPERIMENTAL_SILENCE=1`. See docs/trl.md.
"""

from tito.trl.environment import TitoEnvironment, TitoEnvironmentSpec
from tito.trl.rollout import ENV_ARGS_KEY, TitoRollout

__all__ = ["ENV_ARGS_KEY", "TitoEnvironment", "TitoEnvironmentSpec", "TitoRollout"]
