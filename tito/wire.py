"""The one place where `tito.types` meets the generated protobuf classes, in both directions.

The server's adapter and the client use the same functions, so a field cannot be read one way
and written another.
"""

from __future__ import annotations

import json

from tito.types import (
    EnvironmentInfo,
    Message,
    OpenedSession,
    Role,
    StepResult,
    StepStatus,
    StepTiming,
    TokenizerRegistration,
    ToolCall,
    ToolSpec,
)
from tito.v1 import environment_pb2 as pb


def tool_call_to_pb(c: ToolCall) -> pb.ToolCall:
    return pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments)


def tool_call_from_pb(c: pb.ToolCall) -> ToolCall:
    return ToolCall(id=c.id, name=c.name, arguments=c.arguments)


def message_to_pb(m: Message) -> pb.Message:
    return pb.Message(role=str(m.role), content=m.content, name=m.name, tool_call_id=m.tool_call_id,
                      tool_calls=[tool_call_to_pb(c) for c in m.tool_calls],
                      reasoning_content=m.reasoning_content)


def message_from_pb(m: pb.Message) -> Message:
    """Raises ValueError for an unknown role (a client mistake)."""
    return Message(role=Role(m.role), content=m.content, name=m.name, tool_call_id=m.tool_call_id,
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


def opened_session_from_pb(r: pb.OpenSessionResponse) -> OpenedSession:
    return OpenedSession(session_id=r.session_id, prompt_ids=tuple(r.prompt_ids),
                         tools=tuple(tool_spec_from_pb(t) for t in r.tools),
                         idle_ttl_s=r.idle_ttl_s, hard_ttl_s=r.hard_ttl_s)


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
