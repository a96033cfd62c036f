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


def test_the_run_curves_are_drawn_from_its_metrics(tmp_path):
    from trainer.eval_compare import plot_run

    rows = [{"step": s, "reward_mean": s / 4, "solved_frac": s / 5, "tool_call_frac": 1.0, "refused_attempt_frac": 0.0,
             "step_time_s": 100.0} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plot_run(tmp_path, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit, match="no GRPO step yet"):
        plot_run(tmp_path, tmp_path / "none.png")


def test_call_shaped_turns_the_parser_refused_are_counted():
    from tito.rollout.generation import FinishReason
    from tito.rollout.state import Rollout
    from trainer.report import call_attempts, rollout_metrics, rollout_record
    from trainer.rollout import BatchStats

    texts = {1: '{"name": "run_python", "arguments": {}}', 2: "<tool_call>{}</tool_call>", 3: "<answer>4</answer>"}
    r = Rollout(budget=20)
    r.start([0, 0])
    r.append_generated([1], [-0.1], FinishReason.STOP, 4)  # bare JSON: call-shaped, no call taken
    decode = lambda ids: "".join(texts.get(i, "") for i in ids)  # noqa: E731 - a stand-in tokenizer's decode
    assert call_attempts(r, decode) == (1, 1)
    record = rollout_record(r, 0, decode)
    assert record["call_attempts"] == 1 and record["refused_attempts"] == 1
    metrics = rollout_metrics([record, {**record, "call_attempts": 1, "refused_attempts": 0}], BatchStats())
    assert metrics["refused_attempt_frac"] == 0.5 and metrics["tool_call_frac"] == 0.0
    assert "refused_attempt_frac" not in rollout_metrics([rollout_record(r, 0)], BatchStats())
