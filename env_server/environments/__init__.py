"""Tool environments: the plug-in API (base.py), the built-in `python`, `python_scientific` and `bash`
environments, and discovery (loader.py)."""

from env_server.environments.base import Environment, NoEnvArgs, StrictArgs, ToolError, tool
from tito.types import ToolResult

__all__ = ["Environment", "NoEnvArgs", "StrictArgs", "ToolError", "ToolResult", "tool"]
