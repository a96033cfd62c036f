"""Config precedence and error messages (no Docker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from env_server.__main__ import main
from env_server.config import ConfigError, load_config
from env_server.environments.loader import EnvironmentLoadError, load_environments

REPO = Path(__file__).resolve().parents[2]


def test_example_config_is_valid():
    cfg = load_config(REPO / "examples" / "server.yaml")
    assert cfg.port == 50051 and cfg.sandbox.network_mode == "none" and cfg.pool.target_size == 4


def test_precedence_file_env_flags(tmp_path, monkeypatch):
    f = tmp_path / "c.yaml"
    f.write_text("port: 1000\nidle_ttl_s: 10\nsandbox:\n  mem_limit: 256m\n")
    monkeypatch.setenv("TITO_IDLE_TTL_S", "20")
    monkeypatch.setenv("TITO_SANDBOX__PIDS_LIMIT", "32")
    cfg = load_config(f, port=2000)
    assert cfg.port == 2000  # flag beats file
    assert cfg.idle_ttl_s == 20  # env beats file
    assert cfg.sandbox.mem_limit == "256m" and cfg.sandbox.pids_limit == 32


def test_errors_name_the_field(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("sandbox:\n  pids_limit: -1\nnot_a_setting: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(f)
    msg = str(info.value)
    assert "sandbox.pids_limit" in msg and "not_a_setting" in msg and str(f) in msg
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="hard_ttl_s"):
        load_config(idle_ttl_s=100, hard_ttl_s=10)


def test_cli_reports_config_errors(capsys):
    assert main(["--port", "70000"]) == 2
    assert "port" in capsys.readouterr().err


def test_bad_environment_paths_are_explained():
    with pytest.raises(EnvironmentLoadError, match="cannot import environment module"):
        load_environments(["no_such_module_xyz:Env"])
    with pytest.raises(EnvironmentLoadError, match="no attribute"):
        load_environments(["json:NoSuchClass"])
    with pytest.raises(EnvironmentLoadError, match="not an Environment subclass"):
        load_environments(["json:JSONDecoder"])


def test_task_images_and_repository_limits(monkeypatch):
    cfg = load_config()
    assert cfg.task_images == ["tito-task-*"] and cfg.pool.task_images_target_size == 0
    monkeypatch.setenv("TITO_TASK_IMAGES", '["swe-*", "my/registry:*"]')
    monkeypatch.setenv("TITO_CODING__MAX_BYTES", "1024")
    cfg = load_config()
    assert cfg.task_images == ["swe-*", "my/registry:*"] and cfg.coding.max_bytes == 1024
