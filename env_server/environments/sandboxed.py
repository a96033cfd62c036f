"""The base of the built-in sandboxed environments (`python`, `python_scientific`, `bash`): env_args with
seeded files and a per-call timeout, and a set-up that writes the files before the first call."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from env_server.environments.base import Environment
from env_server.environments.files import MAX_FILES, MAX_TOTAL_BYTES, check_files, seed_files

# A Docker image reference: [registry[:port]/]name[:tag][@digest], lower-case names.
IMAGE_PATTERN = r"^[a-z0-9][a-z0-9._/:-]{0,254}(@sha256:[a-f0-9]{64})?$"


class SandboxEnvArgs(BaseModel):
    """The env_args every sandboxed built-in environment takes."""

    model_config = ConfigDict(extra="forbid")

    timeout_s: float | None = Field(
        default=None, gt=0, le=600, description="Per-call timeout; defaults to the server's sandbox setting."
    )
    files: dict[str, str] = Field(
        default_factory=dict,
        description=f"Text files to create in the working directory before the first call: relative path -> "
                    f"content (UTF-8). At most {MAX_FILES} files, {MAX_TOTAL_BYTES} bytes in all; no absolute "
                    "paths and no '..'.",
    )

    image: str | None = Field(
        default=None, pattern=IMAGE_PATTERN,
        description="The sandbox image of this session (a task's own image, with its repository and dependencies), "
                    "if the server's task_images setting allows it; default: the environment's.",
    )

    @field_validator("files")
    @classmethod
    def _check_files(cls, files: dict[str, str]) -> dict[str, str]:
        return check_files(files)


class SandboxedEnvironment(Environment):
    EnvArgs = SandboxEnvArgs
    needs_sandbox = True

    @classmethod
    def session_image(cls, env_args: BaseModel) -> str | None:
        return getattr(env_args, "image", None)

    async def setup(self) -> None:
        assert self.sandbox is not None, "a sandboxed environment always gets a sandbox"
        await seed_files(self.sandbox, self.env_args.files)
