"""trainer.seeds_report: first/last-window means per run, their mean, and the combined plot."""

from __future__ import annotations

import json

import pytest

from trainer import seeds_report


def _run(tmp_path, name, rewards, wall=None):
    d = tmp_path / name
    d.mkdir()
    rows = [{"step": i + 1, "reward_mean": r} for i, r in enumerate(rewards)]
    # Written out of order: the report sorts by step.
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in reversed(rows)) + "\n")
    if wall is not None:
        (d / "wall_s").write_text(f"{wall}\n")
    return d


def test_table_and_plot(tmp_path, capsys):
    a = _run(tmp_path, "seed0", [0.0, 0.25, 0.5, 0.75, 1.0], wall=300)
    b = _run(tmp_path, "seed1", [None, 0.5, 0.5, 1.0, 1.0])  # a step with no reward counts as 0
    png = tmp_path / "curves.png"
    assert seeds_report.main([str(a), str(b), "--window", "2", "--plot", str(png)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["seed0", "0.125", "0.875", "+0.750", "5", "300"]
    assert out[2].split() == ["seed1", "0.250", "1.000", "+0.750", "5", "-"]
    assert out[3].split() == ["mean", "0.188", "0.938", "+0.750"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_directory_without_metrics_is_named(tmp_path):
    with pytest.raises(SystemExit, match="metrics.jsonl does not exist"):
        seeds_report.main([str(tmp_path)])
