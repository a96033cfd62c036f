"""Server configuration: defaults < YAML file < TITO_* environment variables < command-line flags.

Nested fields use a double underscore in environment variables, e.g.
TITO_SANDBOX__MEM_LIMIT=1g or TITO_POOL__TARGET_SIZE=8.
"""

from __future__ import annotations

import ipaddress
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from env_server.environments.files import RepoLimits
from env_server.sandbox.config import PoolConfig, SandboxConfig

_config_file: ContextVar[Path | None] = ContextVar("tito_config_file", default=None)


class ConfigError(ValueError):
    pass


class TlsConfig(BaseModel):
    """Server TLS. cert_file + key_file turn it on; client_ca_file also requires client certificates
    signed by that CA (mTLS). Files are PEM."""

    model_config = ConfigDict(extra="forbid")

    cert_file: Path | None = Field(None, description="Server certificate chain (PEM).")
    key_file: Path | None = Field(None, description="Private key of cert_file (PEM).")
    client_ca_file: Path | None = Field(None, description="CA that signs client certificates: requires mTLS.")

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @model_validator(mode="after")
    def _pairs(self) -> "TlsConfig":
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("set both cert_file and key_file (TITO_TLS__CERT_FILE, TITO_TLS__KEY_FILE), or neither")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("client_ca_file (mTLS) needs server TLS: set cert_file and key_file as well")
        return self


class AuthConfig(BaseModel):
    """Bearer-token auth: clients send `authorization: Bearer <token>` metadata."""

    model_config = ConfigDict(extra="forbid")

    tokens_file: Path | None = Field(
        None, description="Accepted tokens, one a line ('#' comments and blank lines ignored). Read at start-up."
    )


class ParsingConfig(BaseModel):
    """How tool calls are read from completions (env_server/rendering/parsing.py)."""

    model_config = ConfigDict(extra="forbid")

    strict: bool = Field(
        False,
        description="Answer what the family's deployment parser (vLLM's) reads leniently but the format's grammar "
        "does not allow (a Hermes <tool_call> left open at the end of the output, a Qwen3-Coder </parameter> missing "
        "before the next parameter, a parameter the tool does not declare where its schema allows more) with an "
        "error tool message instead of running the repaired call. A session may choose with "
        "OpenSessionRequest.parsing_strict.")


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve to anything


class ServerConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TITO_", env_nested_delimiter="__", extra="forbid")

    host: str = Field("127.0.0.1", description="Address to listen on. 0.0.0.0 inside a container.")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0: pick a free one).")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535, description="Prometheus /metrics port (0: disabled).")
    server_name: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_.-]{1,63}$",
        description="Labels this server's containers. At start-up the server removes containers of the same "
        "name left by a previous instance; replicas sharing one Docker daemon need distinct names.",
    )
    idle_ttl_s: float = Field(300.0, gt=0, description="A session untouched this long is closed.")
    hard_ttl_s: float = Field(3600.0, gt=0, description="A session is closed this long after opening.")
    reap_interval_s: float = Field(1.0, gt=0, description="How often expired sessions are looked for.")
    max_sessions: int | Literal["auto"] = Field(
        "auto",
        description="Open sessions at once. auto: sized from this machine (capacity.py: memory at session_memory_mb "
                    "a session, file descriptors, process ids, and docker_max_containers with Docker); a number is "
                    "kept as given. Opens past it get RESOURCE_EXHAUSTED naming the limit.",
    )
    session_memory_mb: int | None = Field(None, ge=1, description="Memory budgeted per session when max_sessions is "
                                          "auto; unset: 32 MiB (runc, bwrap) or 72 (runsc), capacity.py says why.")
    docker_max_containers: int = Field(400, ge=1, description="Containers one dockerd is trusted with (max_sessions "
                                                              "auto, Docker backend).")
    environments: list[str] = Field(
        default_factory=list,
        description="Extra environment classes as 'package.module:ClassName' (or a module path).",
    )
    load_entry_points: bool = Field(True, description="Also load environments from 'tito.environments' entry points.")
    environment_images: dict[str, str] = Field(
        default_factory=dict,
        description="Sandbox image per environment name, over the environment's own choice (e.g. "
                    "{python_scientific: my-registry/sci:1}); environments not named use theirs, else sandbox.image.",
    )
    task_images: list[str] = Field(
        default_factory=lambda: ["tito-task-*"],
        description="Sandbox images a session may ask for with env_args `image` (fnmatch patterns), e.g. a SWE-style "
                    "task's own image with its repository and dependencies. Every image runs with the same hardening; "
                    "[] allows none.",
    )
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest gRPC request or response.")
    max_tokenizer_bytes: int = Field(128 * 1024 * 1024, ge=1024,
                                     description="Largest RegisterTokenizer upload (all files together).")
    tokenizer_cache_size: int = Field(16, ge=1, description="Registered tokenizers kept in memory.")
    shutdown_grace_s: float = Field(10.0, ge=0, description="In-flight calls get this long to finish on shutdown.")
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto", description="uvloop roughly halves gRPC overhead per call; auto uses it when installed."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    coding: RepoLimits = Field(default_factory=RepoLimits,
                               description="Limits of the repository a `coding` session sends (env_args files, hidden_files).")
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    pool: PoolConfig = Field(default_factory=PoolConfig)
    parsing: ParsingConfig = Field(default_factory=ParsingConfig)
    tls: TlsConfig = Field(default_factory=TlsConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    allow_insecure: bool = Field(
        False,
        description="Listen on a non-loopback host without TLS and client auth. Only when something else "
        "keeps strangers out (e.g. compose publishing 127.0.0.1 only): the API runs code on request.",
    )
    health_port: int = Field(
        0, ge=0, le=65535,
        description="Also serve grpc.health.v1 alone, in plaintext and without auth, on host:health_port "
        "(0: off). For probes that cannot do TLS, e.g. Kubernetes' grpc probes.",
    )

    @model_validator(mode="after")
    def _ttls(self) -> "ServerConfig":
        if self.hard_ttl_s < self.idle_ttl_s:
            raise ValueError(f"hard_ttl_s ({self.hard_ttl_s}) must be >= idle_ttl_s ({self.idle_ttl_s})")
        return self

    @model_validator(mode="after")
    def _public_needs_security(self) -> "ServerConfig":
        # The API runs arbitrary code: off loopback it needs encryption and a way to know the caller.
        if is_loopback(self.host) or self.allow_insecure:
            return self
        missing = []
        if not self.tls.enabled:
            missing.append("TLS (tls.cert_file + tls.key_file)")
        if self.auth.tokens_file is None and self.tls.client_ca_file is None:
            missing.append("client auth (auth.tokens_file, or tls.client_ca_file for mTLS)")
        if missing:
            raise ValueError(
                f"refusing to listen on {self.host}, which is not loopback, without {' and '.join(missing)}: "
                "anyone who reaches the port could run code. Set what is missing (TITO_TLS__CERT_FILE, TITO_TLS__KEY_FILE, "
                "TITO_AUTH__TOKENS_FILE; see docs/scaling.md), listen on 127.0.0.1, or, when something else keeps "
                "strangers out (a container publishing 127.0.0.1 only), set allow_insecure: true "
                "(TITO_ALLOW_INSECURE=1 or --allow-insecure)"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _YamlFileSource(settings_cls))


class _YamlFileSource(PydanticBaseSettingsSource):
    """Reads the file named by --config / TITO_CONFIG, if any."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # unused: __call__ does it all
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = _config_file.get()
        if path is None:
            return {}
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping of settings, got {type(data).__name__}")
        return data


def load_config(config_file: str | Path | None = None, **overrides: Any) -> ServerConfig:
    """Build the config; errors name the field and the source of the problem."""
    import os

    path = Path(config_file) if config_file else (Path(os.environ["TITO_CONFIG"]) if os.environ.get("TITO_CONFIG") else None)
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    token = _config_file.set(path)
    try:
        return ServerConfig(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as e:
        lines = [f"  {'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
                 for err in e.errors(include_url=False)]
        where = f" (file {path}, TITO_* environment variables, or flags)" if path else " (TITO_* environment variables or flags)"
        raise ConfigError("invalid server configuration" + where + ":\n" + "\n".join(lines)) from None
    finally:
        _config_file.reset(token)
