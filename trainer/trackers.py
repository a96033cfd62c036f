"""Experiment trackers behind `report_to` (TRL's setting): TensorBoard and trackio.

metrics.jsonl and metrics.png are always written; trackers get the same numbers, one call per
optimizer step, on rank 0 only. TensorBoard event files go to `OUT/tensorboard/` (view with
`tensorboard --logdir OUT/tensorboard`); trackio logs to its local database (`TRACKIO_DIR`, by
default under the Hugging Face cache; `trackio show` opens its dashboard), unless its own
variables point it at a Space or server.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainer import report
from trainer.config import TrainConfig

_INSTALL = "pip install 'tito[trainer]'"


def _scalars(metrics: dict[str, Any], prefix: str) -> dict[str, float]:
    return {f"{prefix}/{k}": float(v) for k, v in metrics.items()
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
            and v is not None and math.isfinite(v)}


class Trackers:
    def __init__(self, cfg: TrainConfig, out: Path, *, start_step: int = 1, warm_start: bool = False,
                 enabled: bool = True) -> None:
        """start_step > 1 continues a resumed run: TensorBoard drops events from that step on
        (a killed run may have logged past its checkpoint), trackio continues the same run.
        warm_start: also log the SFT steps of warmstart.jsonl (under warm_start/). enabled=False
        (ranks other than 0) logs nothing."""
        self.tb = None
        self.trackio = None
        if not enabled:
            return
        resumed = start_step > 1
        name = cfg.run_name or Path(cfg.output_dir).resolve().name
        if "tensorboard" in cfg.report_to:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError(f"report_to has 'tensorboard' but it is not installed: {_INSTALL}") from e
            self.tb = SummaryWriter(log_dir=str(out / "tensorboard"),
                                    purge_step=start_step if resumed else None)
        if "trackio" in cfg.report_to:
            try:
                import trackio
            except ImportError as e:
                raise ImportError(f"report_to has 'trackio' but it is not installed: {_INSTALL}") from e
            trackio.init(project=cfg.tracker_project, name=name, config=cfg.model_dump(),
                         resume="allow" if resumed else "never", auto_log_gpu=False, auto_log_cpu=False)
            self.trackio = trackio
        if warm_start:
            for row in report.read_jsonl(out / "warmstart.jsonl"):
                self.log(row, row["step"], prefix="warm_start")

    def log(self, metrics: dict[str, Any], step: int, prefix: str = "train") -> None:
        scalars = _scalars(metrics, prefix)
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, global_step=step)
            self.tb.flush()  # a killed run keeps what it logged
        if self.trackio is not None:
            self.trackio.log(scalars, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.trackio is not None:
            self.trackio.finish()
            self.trackio = None

    def __enter__(self) -> Trackers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
