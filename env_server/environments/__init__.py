"""Tool environments: the plug-in API (base.py), the built-in `python` environment, and discovery."""

from env_server.environments.base import Environment, NoEnvArgs, StrictArgs, ToolError, tool
from tito.types import ToolResult

__all__ = ["Environment", "NoEnvArgs", "StrictArgs", "ToolError", "ToolResult", "tool"]
