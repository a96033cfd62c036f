"""The environment plug-in API.

An environment is a class with tools. A tool is an async method decorated with
`@tool` that takes one pydantic model (its arguments) and returns a string or a
`ToolResult` (`tito.types`). The model's JSON Schema is what ListEnvironments reports and what
the arguments the model wrote are validated against.

`ToolResult` is the one thing an environment returns: from a tool (`done=True, reward=...` ends the
episode there) and from `end(final_text)`, called when the model answers without calling a tool
(its `reward` is the episode's; a `lost_reason` says the environment could not score it, so the
trainer drops the sample instead of training on a reward that is not the model's).
`env_server.testing` runs an environment's episode in-process, for tests and notebooks.

    class Calculator(Environment):
        name = "calculator"
        description = "Adds numbers."

        class AddArgs(BaseModel):
            a: int
            b: int

        @tool
        async def add(self, args: AddArgs) -> str:
            "Add two integers."
            return str(args.a + args.b)
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar, Protocol, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError

from env_server.errors import quote
from tito.types import EnvironmentInfo, ToolCall, ToolResult, ToolSpec

if TYPE_CHECKING:
    from env_server.sandbox.sandbox import Sandbox


class NoEnvArgs(BaseModel):
    """Default env_args schema: accepts nothing."""

    model_config = ConfigDict(extra="forbid")


class StrictArgs(BaseModel):
    """A base for tool arguments: unknown keys are refused, and a number or a list where a string belongs is
    an error rather than silently converted (what a model wrote is what the tool gets, or it is told why not)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ToolError(Exception):
    """Raise inside a tool to send the model an error message (the episode goes on)."""


class SandboxFactory(Protocol):
    """Starts a fresh sandbox of the session's own image, hardened like every sandbox and never seen by the
    model, for work the model must not see or touch: e.g. grading with hidden tests in `end()`. The caller
    owns it and must `await sandbox.destroy()` it. Raises (SandboxError and the like) when none can start:
    an infrastructure failure, not the model's."""

    async def __call__(self) -> Sandbox: ...


@dataclass(frozen=True)
class BoundTool:
    """A tool of an environment class: its public spec and the method that runs it."""

    spec: ToolSpec
    args_model: type[BaseModel]
    method_name: str


log = logging.getLogger(__name__)

_TOOL_MARK = "__tito_tool__"


def tool(fn: Callable | None = None, *, name: str | None = None, description: str | None = None):
    """Mark an async method `async def f(self, args: SomeModel)` as a tool."""

    def mark(f: Callable) -> Callable:
        if not inspect.iscoroutinefunction(f):
            raise TypeError(f"tool {f.__qualname__} must be an async method")
        setattr(f, _TOOL_MARK, {"name": name or f.__name__, "description": description})
        return f

    return mark(fn) if fn is not None else mark


class Environment:
    """Base class of tool environments. Subclasses set `name`, `description` and define tools."""

    name: ClassVar[str]
    description: ClassVar[str] = ""
    # Schema of OpenSession.env_args.
    EnvArgs: ClassVar[type[BaseModel]] = NoEnvArgs
    # True: each session gets its own sandbox container from the warm pool.
    needs_sandbox: ClassVar[bool] = False
    # The sandbox image its sessions run in; None: the server's sandbox.image. The server keeps one
    # warm pool per image (config environment_images overrides this per environment).
    sandbox_image: ClassVar[str | None] = None

    _tools: ClassVar[dict[str, BoundTool]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tools: dict[str, BoundTool] = {}
        for attr, member in inspect.getmembers(cls, inspect.iscoroutinefunction):
            mark = getattr(member, _TOOL_MARK, None)
            if mark is None:
                continue
            params = list(inspect.signature(member).parameters.values())
            hints = get_type_hints(member, include_extras=False)
            if len(params) != 2 or params[1].name not in hints:
                raise TypeError(
                    f"tool {cls.__name__}.{attr} must take exactly one annotated argument: "
                    f"`async def {attr}(self, args: SomeModel)`"
                )
            model = hints[params[1].name]
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise TypeError(f"tool {cls.__name__}.{attr}: argument type must be a pydantic BaseModel")
            doc = mark["description"] or inspect.getdoc(member) or ""
            spec = ToolSpec(mark["name"], doc.strip(), model.model_json_schema())
            tools[spec.name] = BoundTool(spec, model, attr)
        cls._tools = tools

    # Set by the server (and env_server.testing) on sandboxed environments before `setup()`: more sandboxes of
    # the session's image, e.g. a fresh one to grade in. None where there is no sandbox.
    sandbox_factory: SandboxFactory | None = None

    def __init__(self, env_args: BaseModel, sandbox: Sandbox | None = None) -> None:
        self.env_args = env_args
        self.sandbox = sandbox

    # -- lifecycle hooks -------------------------------------------------

    async def setup(self) -> None:
        """Called once after the session's sandbox is attached."""

    async def close(self) -> None:
        """Called once when the session ends. The server destroys the sandbox itself."""

    async def end(self, final_text: str) -> ToolResult:
        """The episode's end: the model answered `final_text` without calling a tool (or used its last turn,
        see `turn_limit`; final_text is then ""). Return its reward (`ToolResult(content=..., done=True,
        reward=...)`; the content goes to the rollout's record, never to the model; None: no reward), or a
        `lost_reason` when the environment itself failed to score it. The default gives no reward."""
        return ToolResult(content="", done=True)

    def turn_limit(self) -> int | None:
        """How many tool-calling turns the episode has: after the last, the step engine ends the episode
        through `end("")`, so it is scored like one the model ended. None (the default): no limit."""
        return None

    @classmethod
    def session_image(cls, env_args: BaseModel) -> str | None:
        """The sandbox image this session asks for (a task's own image), over the environment's; the server
        allows it only if config task_images does. None (the default): the environment's image."""
        return None

    # -- introspection ---------------------------------------------------

    @classmethod
    def tool_specs(cls) -> list[ToolSpec]:
        return [t.spec for t in cls._tools.values()]

    @classmethod
    def session_tool_specs(cls, env_args: BaseModel) -> list[ToolSpec]:
        """The tools one session offers (rendered into its prompt, parsed from its completions): by default all
        of them; an environment whose env_args choose its tools narrows this (and refuses the others)."""
        return cls.tool_specs()

    @classmethod
    def info(cls) -> EnvironmentInfo:
        """What ListEnvironments reports for this environment."""
        return EnvironmentInfo(name=cls.name, description=cls.description, tools=tuple(cls.tool_specs()),
                               env_args_schema=cls.EnvArgs.model_json_schema())

    @classmethod
    def parse_env_args(cls, env_args_json: str, context: dict[str, Any] | None = None) -> BaseModel:
        """Validate OpenSession.env_args; raises ValueError with a message meant for the client. `context` is
        pydantic's validation context: the server passes {"config": its ServerConfig}, for limits it sets."""
        text = env_args_json.strip() or "{}"
        try:
            return cls.EnvArgs.model_validate_json(text, context=context)
        except ValidationError as e:
            raise ValueError(f"env_args for environment {cls.name!r} are invalid: {_short_errors(e)}") from e

    # -- dispatch --------------------------------------------------------

    @classmethod
    def has_tool(cls, name: str) -> bool:
        return name in cls._tools

    async def call_tool(self, call: ToolCall) -> ToolResult:
        """Validate and run one well-formed tool call. Every mistake the model can make becomes a ToolResult."""
        name = call.name
        bound = self._tools.get(name)
        if bound is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return ToolResult.error(f"unknown tool {quote(name)}. Available tools: {known}.")
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
        except json.JSONDecodeError as e:
            return ToolResult.error(
                f"the arguments of {name!r} are not valid JSON ({e.msg} at position {e.pos}). "
                "Send a JSON object matching the tool's schema."
            )
        except RecursionError:
            return ToolResult.error(f"the arguments of {name!r} are nested too deeply. Send a flat JSON object "
                                    "matching the tool's schema.")
        if not isinstance(raw, dict):
            return ToolResult.error(f"the arguments of {name!r} must be a JSON object, got {type(raw).__name__}.")
        try:
            args = bound.args_model.model_validate(raw)
        except ValidationError as e:
            return ToolResult.error(f"invalid arguments for {name!r}: {_short_errors(e)}")
        method: Callable[[BaseModel], Awaitable[ToolResult | str]] = getattr(self, bound.method_name)
        try:
            result = await method(args)
        except ToolError as e:
            return ToolResult.error(str(e))
        except Exception as e:
            # A bug in a tool is reported to the model and logged; the session and server go on.
            log.exception("tool %s of environment %s raised", name, self.name)
            return ToolResult.error(f"the tool {name!r} failed ({type(e).__name__}: {e}).")
        return result if isinstance(result, ToolResult) else ToolResult(content=str(result))


def _short_errors(e: ValidationError) -> str:
    parts = []
    for err in e.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
