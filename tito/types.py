"""The typed vocabulary of one tool call, from the trainer through the proto to the sandbox and back.

Requests (`RegisterTokenizerRequest`, `OpenSessionRequest`, `StepRequest`) and answers
(`TokenizerRegistration`, `OpenedSession`, `StepResult`) alike: the server's engine, the gRPC
adapter, the clients, the trainer and the renderer all speak these types; `tito.wire` is the only
place that converts them to and from the generated protobuf classes. Stdlib only, so a client can
import it without the server's dependencies.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class StepStatus(enum.IntEnum):
    """How a Step ended. Mirrors `tito.v1.StepStatus` value for value (a test keeps them equal).

    The status is the one authority on what a client does next: OK means "append the suffix ids
    and generate the next turn"; every other status ends the episode, and `StepResponse.done`
    is exactly `status != OK`.
    """

    UNSPECIFIED = 0
    OK = 1  # tools ran; suffix_ids hold the tool turn and the next assistant header
    EPISODE_END = 2  # the episode is over on its own terms (no tool call, or a tool ended it)
    SANDBOX_LOST = 3  # the sandbox died; the session cannot go on
    SUFFIX_OVERFLOW = 4  # not even the minimal suffix fits max_suffix_tokens: the rollout is truncated
    ERROR = 5  # the server failed mid-step; tools may have run, so the session is over

    @property
    def done(self) -> bool:
        """The episode is over: no further Step is accepted."""
        return self is not StepStatus.OK


class Role(enum.StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


def call_id(seq: int, index: int) -> str:
    """The id of the index-th call of step `seq` when the model's format carries none.

    The only place call ids are made; the proto documents this format.
    """
    return f"call_{seq}_{index}"


@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model wrote it.

    `arguments` is the JSON text exactly as written, so the environment validates what the
    model produced. `error` is set for a malformed call (bad JSON, no name, ...): it is not
    run, and its tool message tells the model what was wrong.
    """

    id: str
    name: str
    arguments: str
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced: the only thing an environment's tool returns to the server."""

    content: str
    # The model made a mistake (bad arguments, unknown tool, the tool refused): content says what.
    is_error: bool = False
    # Output was cut while produced (the sandbox's caps) or to fit the token budget.
    truncated: bool = False
    # Set when the session's sandbox died during the call; the session cannot go on.
    lost_reason: str | None = None
    # The environment ends the episode after this call, with this reward (if any).
    done: bool = False
    reward: float | None = None

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    @classmethod
    def error(cls, content: str) -> ToolResult:
        return cls(content=f"Error: {content}", is_error=True)


@dataclass(frozen=True)
class Message:
    """A chat message (OpenAI-style roles)."""

    role: Role
    content: str = ""
    name: str = ""  # role tool: the tool's name
    tool_call_id: str = ""  # role tool: the call this answers
    tool_calls: tuple[ToolCall, ...] = ()  # role assistant: the calls it made
    reasoning_content: str = ""  # role assistant, on templates that render reasoning

    @classmethod
    def tool_result(cls, call: ToolCall, content: str) -> Message:
        return cls(role=Role.TOOL, content=content, name=call.name, tool_call_id=call.id)

    def to_dict(self) -> dict[str, Any]:
        """The OpenAI-style dict (empty optional fields left out; call arguments as JSON text)."""
        d: dict[str, Any] = {"role": str(self.role), "content": self.content}
        if self.name:
            d["name"] = self.name
        if self.tool_call_id:
            d["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            d["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                               for c in self.tool_calls]
        if self.reasoning_content:
            d["reasoning_content"] = self.reasoning_content
        return d

    @classmethod
    def coerce(cls, m: Message | dict[str, Any]) -> Message:
        """Accepts an OpenAI-style dict ({"role": "user", "content": ...}) as well as a Message."""
        if isinstance(m, Message):
            return m
        calls = tuple(
            c if isinstance(c, ToolCall) else _tool_call_from_openai(c) for c in (m.get("tool_calls") or ())
        )
        return cls(
            role=Role(m["role"]),
            content=m.get("content") or "",
            name=m.get("name") or "",
            tool_call_id=m.get("tool_call_id") or "",
            tool_calls=calls,
            reasoning_content=m.get("reasoning_content") or "",
        )


def _tool_call_from_openai(c: dict[str, Any]) -> ToolCall:
    fn = c.get("function", c)
    args = fn.get("arguments", "{}")
    return ToolCall(id=c.get("id", ""), name=fn.get("name", ""),
                    arguments=args if isinstance(args, str) else json.dumps(args))


@dataclass(frozen=True)
class StepTiming:
    parse_ms: float = 0.0
    tools_ms: float = 0.0
    render_ms: float = 0.0
    total_ms: float = 0.0


@dataclass(frozen=True)
class StepResult:
    """The answer to one Step."""

    seq: int
    status: StepStatus
    tool_calls: tuple[ToolCall, ...] = ()
    tool_messages: tuple[Message, ...] = ()
    # OK only: the tool turn plus the next assistant header, to append verbatim (mask 0).
    suffix_ids: tuple[int, ...] = ()
    reward: float | None = None
    truncated: bool = False  # some tool output was cut (while produced, or to fit the budget)
    # Why, for statuses other than OK; with EPISODE_END, what the environment said of the end (for
    # the rollout's record, never shown to the model).
    detail: str = ""
    timing: StepTiming = field(default_factory=StepTiming)

    @property
    def done(self) -> bool:
        return self.status.done


@dataclass(frozen=True)
class ToolSpec:
    """A tool as ListEnvironments and OpenSession describe it."""

    name: str
    description: str
    parameters: dict[str, Any]  # JSON Schema of the arguments object

    def openai_spec(self) -> dict[str, Any]:
        """The OpenAI-style function spec that chat templates render."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class EnvironmentInfo:
    name: str
    description: str
    tools: tuple[ToolSpec, ...]
    env_args_schema: dict[str, Any]


@dataclass(frozen=True)
class OpenedSession:
    session_id: str
    prompt_ids: tuple[int, ...]  # empty when the session was opened without a tokenizer
    tools: tuple[ToolSpec, ...]
    idle_ttl_s: float = 0.0
    hard_ttl_s: float = 0.0


@dataclass(frozen=True)
class TokenizerRegistration:
    fingerprint: str
    stop_token_ids: tuple[int, ...]
    template_family: str
    renderer_version: str


# ------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class RegisterTokenizerRequest:
    files: Mapping[str, bytes]  # file name -> bytes (tokenizer.json, tokenizer_config.json, chat template)
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OpenSessionRequest:
    environment: str
    tokenizer_fingerprint: str = ""  # empty: no ids are rendered (the client steps with parsed tool calls)
    messages: tuple[Message, ...] = ()
    env_args_json: str = ""  # a JSON object, validated by the environment (empty: none)
    client_request_id: str = ""  # idempotency key: a retried OpenSession returns the same session
    parsing_strict: bool | None = None  # None: the server's parsing.strict

    @classmethod
    def build(cls, environment: str, messages: Any = (), *, fingerprint: str = "",
              env_args: Mapping[str, Any] | None = None, client_request_id: str = "",
              parsing_strict: bool | None = None) -> OpenSessionRequest:
        """From OpenAI-style dicts or Messages and an env_args mapping."""
        return cls(environment=environment, tokenizer_fingerprint=fingerprint,
                   messages=tuple(Message.coerce(m) for m in messages),
                   env_args_json=json.dumps(dict(env_args)) if env_args else "",
                   client_request_id=client_request_id, parsing_strict=parsing_strict)


@dataclass(frozen=True)
class StepRequest:
    """One assistant turn of a session: the generated ids (stop token included), or tool calls the
    client parsed itself (with `assistant_content`, the turn's text, for the reward)."""

    session_id: str
    seq: int  # 1 for the first turn, one more per turn; repeating the last seq replays its answer
    completion_ids: tuple[int, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()  # used when completion_ids is empty
    assistant_content: str = ""
    max_suffix_tokens: int | None = None  # None: no limit; 0 is a real budget of zero
    tokenizer_fingerprint: str = ""  # checked against the session's when given
