import pytest

from trainer.config import ConfigError, load_config


def test_yaml_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("budget: {context: 512}\nsteps: 3\n")
    cfg = load_config(p, ["budget.per_turn=32", "loss.norm=token", "env.address=h:1"], {"steps": 5})
    assert cfg.budget.context == 512 and cfg.budget.per_turn == 32 and cfg.steps == 5
    assert cfg.loss.norm == "token" and cfg.env.address == "h:1"


@pytest.mark.parametrize("override,field", [
    ("budget.contxt=5", "budget.contxt"),
    ("budget.context=abc", "budget.context"),
    ("loss.norm=mean", "loss.norm"),
    ("num_generations=0", "num_generations"),
    ("budget.reserve=4096", "budget"),
])
def test_errors_name_the_field(override, field):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert f"  {field}:" in str(e.value)


def test_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "b.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(bad)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["novalue"])


def test_demo_config_loads():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for name in ("demo.yaml", "learn_tokens.yaml", "coding_grpo.yaml"):
        load_config(root / "examples" / name)
