from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StepStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATUS_UNSPECIFIED: _ClassVar[StepStatus]
    STEP_STATUS_OK: _ClassVar[StepStatus]
    STEP_STATUS_EPISODE_END: _ClassVar[StepStatus]
    STEP_STATUS_SANDBOX_LOST: _ClassVar[StepStatus]
    STEP_STATUS_SUFFIX_OVERFLOW: _ClassVar[StepStatus]
    STEP_STATUS_ERROR: _ClassVar[StepStatus]
STEP_STATUS_UNSPECIFIED: StepStatus
STEP_STATUS_OK: StepStatus
STEP_STATUS_EPISODE_END: StepStatus
STEP_STATUS_SANDBOX_LOST: StepStatus
STEP_STATUS_SUFFIX_OVERFLOW: StepStatus
STEP_STATUS_ERROR: StepStatus

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class Message(_message.Message):
    __slots__ = ("role", "content", "name", "tool_call_id", "tool_calls", "reasoning_content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    name: str
    tool_call_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    reasoning_content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., name: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., reasoning_content: _Optional[str] = ...) -> None: ...

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "parameters_json_schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json_schema: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json_schema: _Optional[str] = ...) -> None: ...

class EnvironmentSpec(_message.Message):
    __slots__ = ("name", "description", "tools", "env_args_json_schema")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    ENV_ARGS_JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    env_args_json_schema: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., env_args_json_schema: _Optional[str] = ...) -> None: ...

class ListEnvironmentsResponse(_message.Message):
    __slots__ = ("environments",)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentSpec]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentSpec, _Mapping]]] = ...) -> None: ...

class RegisterTokenizerRequest(_message.Message):
    __slots__ = ("files", "chat_template_kwargs_json")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    FILES_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    files: _containers.ScalarMap[str, bytes]
    chat_template_kwargs_json: str
    def __init__(self, files: _Optional[_Mapping[str, bytes]] = ..., chat_template_kwargs_json: _Optional[str] = ...) -> None: ...

class RegisterTokenizerResponse(_message.Message):
    __slots__ = ("fingerprint", "template_family", "stop_token_ids", "renderer_version")
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FAMILY_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RENDERER_VERSION_FIELD_NUMBER: _ClassVar[int]
    fingerprint: str
    template_family: str
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    renderer_version: str
    def __init__(self, fingerprint: _Optional[str] = ..., template_family: _Optional[str] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., renderer_version: _Optional[str] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ("environment", "tokenizer_fingerprint", "messages", "env_args", "client_request_id", "parsing_strict")
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ENV_ARGS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PARSING_STRICT_FIELD_NUMBER: _ClassVar[int]
    environment: str
    tokenizer_fingerprint: str
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    env_args: str
    client_request_id: str
    parsing_strict: bool
    def __init__(self, environment: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., env_args: _Optional[str] = ..., client_request_id: _Optional[str] = ..., parsing_strict: bool = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("session_id", "prompt_ids", "tools", "idle_ttl_s", "hard_ttl_s")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    IDLE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    HARD_TTL_S_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    tools: _containers.RepeatedCompositeFieldContainer[ToolSpec]
    idle_ttl_s: float
    hard_ttl_s: float
    def __init__(self, session_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., tools: _Optional[_Iterable[_Union[ToolSpec, _Mapping]]] = ..., idle_ttl_s: _Optional[float] = ..., hard_ttl_s: _Optional[float] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("session_id", "seq", "completion_ids", "tool_calls", "max_suffix_tokens", "assistant_content", "tokenizer_fingerprint")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_IDS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_SUFFIX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    completion_ids: _containers.RepeatedScalarFieldContainer[int]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    max_suffix_tokens: int
    assistant_content: str
    tokenizer_fingerprint: str
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ..., completion_ids: _Optional[_Iterable[int]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., max_suffix_tokens: _Optional[int] = ..., assistant_content: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("parse_ms", "tools_ms", "render_ms", "total_ms")
    PARSE_MS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_MS_FIELD_NUMBER: _ClassVar[int]
    RENDER_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    parse_ms: float
    tools_ms: float
    render_ms: float
    total_ms: float
    def __init__(self, parse_ms: _Optional[float] = ..., tools_ms: _Optional[float] = ..., render_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("tool_messages", "suffix_ids", "done", "reward", "truncated", "status", "timing", "tool_calls", "detail", "seq")
    TOOL_MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SUFFIX_IDS_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    TIMING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    tool_messages: _containers.RepeatedCompositeFieldContainer[Message]
    suffix_ids: _containers.RepeatedScalarFieldContainer[int]
    done: bool
    reward: float
    truncated: bool
    status: StepStatus
    timing: StepTiming
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    detail: str
    seq: int
    def __init__(self, tool_messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ..., suffix_ids: _Optional[_Iterable[int]] = ..., done: bool = ..., reward: _Optional[float] = ..., truncated: bool = ..., status: _Optional[_Union[StepStatus, str]] = ..., timing: _Optional[_Union[StepTiming, _Mapping]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., detail: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: bool = ...) -> None: ...
