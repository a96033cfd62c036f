"""Finds environment classes: the `tito.environments` entry points, then module paths from config.

A module path is "package.module:ClassName" (or "package.module", taking every Environment
subclass defined in that module). Later sources override earlier ones of the same name.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from importlib.metadata import entry_points

from env_server.environments.base import Environment
from env_server.environments.bash_env import BashEnvironment
from env_server.environments.coding_env import CodingEnvironment
from env_server.environments.python_env import PythonEnvironment, ScientificPythonEnvironment
from env_server.environments.reasoning_gym_env import ReasoningGymEnvironment

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "tito.environments"


class EnvironmentLoadError(RuntimeError):
    pass


def load_environments(module_paths: list[str], use_entry_points: bool = True) -> dict[str, type[Environment]]:
    found: dict[str, type[Environment]] = {
        cls.name: cls for cls in (PythonEnvironment, ScientificPythonEnvironment, BashEnvironment, CodingEnvironment,
                                  ReasoningGymEnvironment)}
    if use_entry_points:
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            # A broken third-party plug-in must not stop the server: log it and go on.
            try:
                _add(found, ep.load(), f"entry point {ep.name}={ep.value}")
            except Exception as e:
                log.error("skipping environment entry point %s (%s): %s", ep.name, ep.value, e)
    for path in module_paths:
        for cls in _import_path(path):
            _add(found, cls, f"module path {path!r}")
    return found


def _import_path(path: str) -> list[type[Environment]]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise EnvironmentLoadError(
            f"cannot import environment module {module_name!r} (from {path!r}): {e}. "
            "Check the module is on PYTHONPATH and the path is 'package.module:ClassName'."
        ) from e
    if attr:
        cls = getattr(module, attr, None)
        if cls is None:
            raise EnvironmentLoadError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})")
        return [cls]
    classes = [
        obj
        for _, obj in inspect.getmembers(module, inspect.isclass)
        if issubclass(obj, Environment) and obj is not Environment and obj.__module__ == module.__name__
    ]
    if not classes:
        raise EnvironmentLoadError(f"module {module_name!r} defines no Environment subclass")
    return classes


def _add(found: dict[str, type[Environment]], cls: object, source: str) -> None:
    if not (inspect.isclass(cls) and issubclass(cls, Environment)):
        raise EnvironmentLoadError(f"{source} is not an Environment subclass: {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise EnvironmentLoadError(f"{source}: environment class {cls.__name__} must set a non-empty `name`")
    if not cls.tool_specs():
        raise EnvironmentLoadError(f"{source}: environment {name!r} defines no @tool method")
    if name in found and found[name] is not cls:
        log.info("environment %r from %s overrides %s", name, source, found[name].__qualname__)
    found[name] = cls
