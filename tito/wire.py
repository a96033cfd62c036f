"""The one place where `tito.types` meets the generated protobuf classes, in both directions.

Requests and answers alike: the client writes a request with `*_to_pb` and the server's adapter
reads it with `*_from_pb` (and the reverse for answers), so a field cannot be written one way and
read another. A request a client got wrong raises ValueError with a message for that client.
"""

from __future__ import annotations

import json

from tito.types import (EnvironmentInfo, Message, OpenedSession, OpenSessionRequest, RegisterTokenizerRequest, Role,
                        StepRequest, StepResult, StepStatus, StepTiming, TokenizerRegistration, ToolCall, ToolSpec)
from tito.v1 import environment_pb2 as pb


def tool_call_to_pb(c: ToolCall) -> pb.ToolCall:
    return pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments)


def tool_call_from_pb(c: pb.ToolCall) -> ToolCall:
    return ToolCall(id=c.id, name=c.name, arguments=c.arguments)


def message_to_pb(m: Message) -> pb.Message:
    return pb.Message(role=str(m.role), content=m.content, name=m.name, tool_call_id=m.tool_call_id,
                      tool_calls=[tool_call_to_pb(c) for c in m.tool_calls],
                      reasoning_content=m.reasoning_content)


def message_from_pb(m: pb.Message, index: int = 0) -> Message:
    """Raises ValueError for an unknown role (a client mistake), naming the message's index."""
    try:
        role = Role(m.role)
    except ValueError:
        roles = ", ".join(r.value for r in Role)
        raise ValueError(f"messages[{index}].role is {m.role[:64]!r}; use one of {roles}") from None
    return Message(role=role, content=m.content, name=m.name, tool_call_id=m.tool_call_id,
                   tool_calls=tuple(tool_call_from_pb(c) for c in m.tool_calls),
                   reasoning_content=m.reasoning_content)


def tool_spec_to_pb(s: ToolSpec) -> pb.ToolSpec:
    return pb.ToolSpec(name=s.name, description=s.description, parameters_json_schema=json.dumps(s.parameters))


def tool_spec_from_pb(s: pb.ToolSpec) -> ToolSpec:
    return ToolSpec(name=s.name, description=s.description,
                    parameters=json.loads(s.parameters_json_schema or "{}"))


def environment_to_pb(e: EnvironmentInfo) -> pb.EnvironmentSpec:
    return pb.EnvironmentSpec(name=e.name, description=e.description,
                              tools=[tool_spec_to_pb(t) for t in e.tools],
                              env_args_json_schema=json.dumps(e.env_args_schema))


def environment_from_pb(e: pb.EnvironmentSpec) -> EnvironmentInfo:
    return EnvironmentInfo(name=e.name, description=e.description,
                           tools=tuple(tool_spec_from_pb(t) for t in e.tools),
                           env_args_schema=json.loads(e.env_args_json_schema or "{}"))


# ------------------------------------------------------------------------------------ requests


def register_request_to_pb(r: RegisterTokenizerRequest) -> pb.RegisterTokenizerRequest:
    return pb.RegisterTokenizerRequest(files=dict(r.files), chat_template_kwargs_json=json.dumps(dict(r.chat_template_kwargs)))


def register_request_from_pb(r: pb.RegisterTokenizerRequest) -> RegisterTokenizerRequest:
    """Raises ValueError when chat_template_kwargs_json is not a JSON object."""
    return RegisterTokenizerRequest(files=dict(r.files),
                                    chat_template_kwargs=_json_object(r.chat_template_kwargs_json, "chat_template_kwargs_json"))


def open_request_to_pb(r: OpenSessionRequest) -> pb.OpenSessionRequest:
    return pb.OpenSessionRequest(environment=r.environment, tokenizer_fingerprint=r.tokenizer_fingerprint,
                                 messages=[message_to_pb(m) for m in r.messages], env_args=r.env_args_json,
                                 client_request_id=r.client_request_id, parsing_strict=r.parsing_strict)


def open_request_from_pb(r: pb.OpenSessionRequest) -> OpenSessionRequest:
    """Raises ValueError for a message with an unknown role."""
    return OpenSessionRequest(environment=r.environment, tokenizer_fingerprint=r.tokenizer_fingerprint,
                              messages=tuple(message_from_pb(m, i) for i, m in enumerate(r.messages)),
                              env_args_json=r.env_args, client_request_id=r.client_request_id,
                              parsing_strict=r.parsing_strict if r.HasField("parsing_strict") else None)


def step_request_to_pb(r: StepRequest) -> pb.StepRequest:
    out = pb.StepRequest(session_id=r.session_id, seq=r.seq, completion_ids=list(r.completion_ids),
                         tool_calls=[tool_call_to_pb(c) for c in r.tool_calls],
                         assistant_content=r.assistant_content, tokenizer_fingerprint=r.tokenizer_fingerprint)
    if r.max_suffix_tokens is not None:  # unset means no limit; 0 is a budget
        out.max_suffix_tokens = max(0, r.max_suffix_tokens)
    return out


def step_request_from_pb(r: pb.StepRequest) -> StepRequest:
    return StepRequest(
        session_id=r.session_id, seq=r.seq, completion_ids=tuple(r.completion_ids),
        tool_calls=tuple(tool_call_from_pb(c) for c in r.tool_calls), assistant_content=r.assistant_content,
        max_suffix_tokens=r.max_suffix_tokens if r.HasField("max_suffix_tokens") else None,
        tokenizer_fingerprint=r.tokenizer_fingerprint)


# ------------------------------------------------------------------------------------ answers


def opened_session_to_pb(o: OpenedSession) -> pb.OpenSessionResponse:
    return pb.OpenSessionResponse(session_id=o.session_id, prompt_ids=o.prompt_ids,
                                  tools=[tool_spec_to_pb(t) for t in o.tools],
                                  idle_ttl_s=o.idle_ttl_s, hard_ttl_s=o.hard_ttl_s)


def opened_session_from_pb(r: pb.OpenSessionResponse) -> OpenedSession:
    return OpenedSession(session_id=r.session_id, prompt_ids=tuple(r.prompt_ids),
                         tools=tuple(tool_spec_from_pb(t) for t in r.tools),
                         idle_ttl_s=r.idle_ttl_s, hard_ttl_s=r.hard_ttl_s)


def registration_to_pb(r: TokenizerRegistration) -> pb.RegisterTokenizerResponse:
    return pb.RegisterTokenizerResponse(fingerprint=r.fingerprint, template_family=r.template_family,
                                        stop_token_ids=r.stop_token_ids, renderer_version=r.renderer_version)


def registration_from_pb(r: pb.RegisterTokenizerResponse) -> TokenizerRegistration:
    return TokenizerRegistration(fingerprint=r.fingerprint, stop_token_ids=tuple(r.stop_token_ids),
                                 template_family=r.template_family, renderer_version=r.renderer_version)


def step_result_to_pb(r: StepResult) -> pb.StepResponse:
    t = r.timing
    out = pb.StepResponse(
        seq=r.seq, status=int(r.status), done=r.done, truncated=r.truncated, detail=r.detail,
        tool_calls=[tool_call_to_pb(c) for c in r.tool_calls],
        tool_messages=[message_to_pb(m) for m in r.tool_messages],
        suffix_ids=r.suffix_ids,
        timing=pb.StepTiming(parse_ms=t.parse_ms, tools_ms=t.tools_ms, render_ms=t.render_ms,
                             total_ms=t.total_ms),
    )
    if r.reward is not None:
        out.reward = r.reward
    return out


def step_result_from_pb(r: pb.StepResponse) -> StepResult:
    t = r.timing
    try:
        status = StepStatus(r.status)
    except ValueError:  # a newer server's status this client does not know: it cannot go on
        status = StepStatus.ERROR
    return StepResult(
        seq=r.seq, status=status,
        tool_calls=tuple(tool_call_from_pb(c) for c in r.tool_calls),
        tool_messages=tuple(Message(role=Role.TOOL, content=m.content, name=m.name, tool_call_id=m.tool_call_id)
                            for m in r.tool_messages),
        suffix_ids=tuple(r.suffix_ids),
        reward=r.reward if r.HasField("reward") else None,
        truncated=r.truncated, detail=r.detail,
        timing=StepTiming(parse_ms=t.parse_ms, tools_ms=t.tools_ms, render_ms=t.render_ms, total_ms=t.total_ms),
    )


def _json_object(text: str, name: str) -> dict:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{name} is not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{name} is nested too deeply to parse") from None
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object")
    return value
