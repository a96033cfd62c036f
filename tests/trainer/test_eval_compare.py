"""trainer.eval_compare: accuracy of several evaluations side by side and the paired change between them."""

from __future__ import annotations

import json

import pytest

from trainer.eval_compare import main, paired_difference


def _eval(folder, rewards):
    folder.mkdir()
    rows = [{"index": i, "reward": r} for i, r in enumerate(rewards)]
    (folder / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    right = [1.0 if r >= 1.0 else 0.0 for r in rewards]
    (folder / "summary.json").write_text(json.dumps({
        "scored": len(rows), "accuracy": sum(right) / len(rows), "accuracy_ci95": [0.0, 1.0], "tool_call_rate": 0.5,
        "refused_attempts": 1, "tool_call_attempts": 2, "mean_turns": 1.5, "mean_generated_tokens": 40}))
    return str(folder)


def test_paired_difference_counts_full_marks_on_matched_problems():
    same = paired_difference({0: 1.0, 1: 0.0}, {0: 1.0, 1: 0.0})
    assert same[:3] == (0.0, 0.0, 0.0) and same[3] == 2
    # 60 of 100 problems newly right, none lost: +0.6, an interval that excludes 0.
    d, low, high, n = paired_difference({i: 0.0 for i in range(100)}, {i: float(i < 60) for i in range(100)})
    assert d == pytest.approx(0.6) and 0.0 < low < 0.6 < high <= 1.0 and n == 100
    # A problem the later evaluation dropped counts as wrong there.
    assert paired_difference({0: 1.0, 1: 1.0}, {0: 1.0})[0] == pytest.approx(-0.5)


def test_the_table_names_each_evaluation_and_the_change(tmp_path, capsys):
    base = _eval(tmp_path / "base", [0.0] * 8 + [1.0] * 2)
    mid = _eval(tmp_path / "mid", [0.5] * 5 + [1.0] * 5)
    end = _eval(tmp_path / "end", [1.0] * 9 + [0.0])
    assert main([base, mid, end, "--labels", "before,warm,after"]) == 0
    out = capsys.readouterr().out
    assert "| before | 10 | 0.200" in out and "| after | 10 | 0.900" in out and "+70.0 pts" in out
    assert "after against warm: +40.0 points" in out
    with pytest.raises(SystemExit):
        main([base])
    with pytest.raises(SystemExit, match="not a trainer.evaluate output"):
        main([base, str(tmp_path / "missing")])
