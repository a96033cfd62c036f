"""`TitoEnvironmentSpec`: tito behind TRL's own tool loop (`GRPOTrainer(environment_factory=...)`).

    spec = TitoEnvironmentSpec("127.0.0.1:50051", "python", env_args=lambda row: {"expected_answer": row["answer"]})
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, train_dataset=dataset,
                          args=GRPOConfig(..., chat_template_kwargs=spec.chat_template_kwargs),
                          environment_factory=spec.environment_factory, reward_funcs=spec.reward_funcs)

The shape of TRL's own `trl.experimental.openreward.OpenRewardSpec`. Each environment instance
has one typed, documented method per tool of the tito environment (TRL builds the tool schema the
model sees from the signature and docstring). `reset(**row)` opens a tito session; each tool call
TRL parses becomes one Step with that parsed call; `reward_funcs` ends each episode with the final
assistant text, so the environment scores it, and closes the session.

What this door gives up, against `TitoRollout`: TRL renders the prompt and the tool suffixes, so
there is no tokenizer fingerprint and the tool schema is TRL's docstring schema, not tito's; TRL
parses the tool calls (a malformed call silently becomes a final answer instead of an error the
model sees); TRL drops a whole tool result that would overflow `max_completion_length` instead of
tito's head/tail cut; and TRL calls the tools of one rollout after another, never in parallel.
`chat_template_kwargs={"sanitize_control_tokens": True}` in GRPOConfig is required (checked when
GRPOTrainer builds the environments): without it, tool output containing `<|im_end|>` or
`<tool_call>` becomes control tokens in TRL's suffix.

Sessions are always closed: by the reward function, at the next `reset` of the same instance (TRL
only ever resets), at `spec.close()` and at interpreter exit; the server's idle lease reclaims
whatever a killed process leaves.
"""

from __future__ import annotations

import atexit
import inspect
import json
import keyword
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal

from tito.client import Session, TitoClient
from tito.trl._common import (ABORTED, COMPLETED, EnvClock, attempt, connect, log, log_status_metrics, status_reward,
                              truncated)
from tito.types import EnvironmentInfo, StepStatus, ToolCall, ToolSpec

SANITIZE = {"sanitize_control_tokens": True}
_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list,
                                "object": dict}
_RESERVED = {"reset", "get_reward"}  # TRL's own names on an environment


class TitoEnvironment:
    """One rollout slot of GRPOTrainer. Its public methods are the tools (bound per spec); the
    episode state is plain attributes, which TRL does not mistake for tools."""

    def __init__(self, spec: TitoEnvironmentSpec) -> None:
        self._spec = spec
        self._session: Session | None = None
        self._new_episode()

    def _new_episode(self) -> None:
        self.status: str | None = None  # completed / truncated:<cause> / aborted, once over
        self.reward: float | None = None
        self.tool_calls = 0
        self.tool_output_cut = False
        self.session_id: str | None = None

    def reset(self, **row: Any) -> None:
        """Close the previous episode's session (if the reward function did not) and open one."""
        self._close()
        self._new_episode()
        with self._spec.clock.timing():
            self._session = self._spec.client.open_session(self._spec.environment,
                                                           env_args=self._spec.env_args_of(row))
        self.session_id = self._session.id
        return None  # the dataset's prompt is the prompt

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        if self._session is None or self.status is not None:
            return "Error: the episode is over; no tool can run."
        try:
            with self._spec.clock.timing():
                result = self._session.step(tool_calls=[ToolCall(id="", name=name, arguments=json.dumps(arguments))])
        except Exception:
            self.status = ABORTED  # TRL reports the error to the model and counts a tool failure
            raise
        self.tool_calls += 1
        self.tool_output_cut |= result.truncated
        if result.status is StepStatus.EPISODE_END:  # a tool ended the episode (e.g. a correct guess)
            self.status, self.reward = COMPLETED, result.reward
        elif result.status is not StepStatus.OK:
            self.status = ABORTED
        text = "\n".join(m.content for m in result.tool_messages)
        return text or f"Error: {result.status.name}: {result.detail or 'no output'}"

    async def _finish(self, final_text: str | None, status: str) -> None:
        """End the episode with the final answer (None: cut short, nothing to score), then close."""
        session = self._session
        try:
            if session is not None and self.status is None:
                self.status = status
                if final_text is not None:
                    end = await session.aio.step(assistant_content=final_text)
                    self.reward = end.reward
                    if end.status is not StepStatus.EPISODE_END:
                        self.status = ABORTED
        finally:
            if session is not None:
                self._session = None
                await session.aio.close()

    def _close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            try:
                with self._spec.clock.timing():
                    session.close()
            except Exception as e:  # noqa: BLE001 - the server's lease reclaims it
                log.warning("CloseSession(%s) failed: %s", session.id, e)


class TitoEnvironmentSpec:
    """`environment_factory`, `reward_funcs` and `chat_template_kwargs` for a tito environment.

    Args:
        address_or_client: the env server's "host:port", or a `tito.client.TitoClient` (not closed here).
        environment: the tito environment; its tools become the methods TRL offers the model.
        env_args: the env args of a dataset row (default: the row's `tito_env_args` JSON, if any).
        truncated_reward: the reward of a rollout TRL cut short (None: TRL ignores it).
        check_config: refuse a GRPOConfig without `chat_template_kwargs=spec.chat_template_kwargs`.
    """

    chat_template_kwargs = SANITIZE

    def __init__(self, address_or_client: str | TitoClient, environment: str = "python", *,
                 env_args: Callable[[Mapping[str, Any]], Mapping[str, Any] | None] | None = None,
                 truncated_reward: float | None = 0.0, check_config: bool = True,
                 ready_timeout_s: float = 120.0) -> None:
        self.environment = environment
        self.truncated_reward = truncated_reward
        self.check_config = check_config
        self._env_args = env_args
        self.client, self._owns_client = connect(address_or_client, ready_timeout_s)
        self._instances: list[TitoEnvironment] = []
        self._lock = threading.Lock()
        self._ends: frozenset[int] = frozenset()  # TRL's end-of-completion ids, once seen
        self.clock = EnvClock()
        try:
            self.info: EnvironmentInfo = self.client.environment(environment)
            self._cls = environment_class(self.info)
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def env_args_of(self, row: Mapping[str, Any]) -> dict[str, Any] | None:
        if self._env_args is not None:
            args = self._env_args(row)
            return dict(args) if args else None
        raw = row.get("tito_env_args")
        return json.loads(raw) if raw else None

    @property
    def environment_factory(self) -> Callable[[], TitoEnvironment]:
        def factory() -> TitoEnvironment:
            if not self._ends:
                self._inspect_trainer()
            env = self._cls(self)
            with self._lock:
                self._instances.append(env)
            return env
        return factory

    @property
    def reward_funcs(self) -> Callable[..., list[float | None]]:
        def tito_reward(completions: list, environments: list[TitoEnvironment] | None = None,
                        completion_ids: list[list[int]] | None = None, log_metric: Any = None,
                        **_: Any) -> list[float | None]:
            if environments is None:
                raise ValueError("TitoEnvironmentSpec.reward_funcs needs GRPOTrainer(environment_factory="
                                 "spec.environment_factory): it ends the episodes of those environments")
            ids = completion_ids or [None] * len(completions)
            ends = [self._final(c, i) for c, i in zip(completions, ids, strict=True)]
            with self.clock.timing():
                done = self.client.gather([attempt(env._finish(text, status))
                                           for env, (text, status) in zip(environments, ends, strict=True)])
            for env, d in zip(environments, done):
                if isinstance(d, Exception):
                    log.warning("ending session %s failed: %s", env.session_id, d)
                    env.status = ABORTED
            statuses = [e.status or ABORTED for e in environments]
            log_status_metrics(log_metric, statuses, [e.tool_calls for e in environments], self.clock)
            return [status_reward(s, e.reward, self.truncated_reward) for s, e in zip(statuses, environments)]
        return tito_reward

    def _final(self, completion: Any, ids: list[int] | None) -> tuple[str | None, str]:
        """The final answer of a TRL completion (None when there is none to score) and its status."""
        if ids and self._ends and ids[-1] not in self._ends:  # TRL's own test for "cut by length"
            return None, truncated("length")
        messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
        last = messages[-1] if messages else {}
        if last.get("tool_calls"):  # max_tool_calling_iterations stopped it mid-episode
            return None, truncated("max_turns")
        return str(last.get("content") or ""), COMPLETED

    def _inspect_trainer(self) -> None:
        """GRPOTrainer.__init__ calls the factory with itself and its `args` in scope: take its
        end-of-turn ids (to tell a cut completion) and refuse a config whose templates would turn
        control-token text in tool output into control tokens."""
        frame = sys._getframe(2)
        for _ in range(4):
            if frame is None:
                return
            trainer, args = frame.f_locals.get("self"), frame.f_locals.get("args")
            if type(trainer).__name__.endswith("GRPOTrainer") and args is not None:
                break
            frame = frame.f_back
        else:
            return
        if self.check_config and not (getattr(args, "chat_template_kwargs", None) or {}).get("sanitize_control_tokens"):
            raise ValueError(
                "TitoEnvironmentSpec needs GRPOConfig(chat_template_kwargs={'sanitize_control_tokens': True}) "
                "(spec.chat_template_kwargs): otherwise TRL renders tool output such as '<|im_end|>' or "
                "'<tool_call>' as control tokens. Pass check_config=False to the spec to skip this check.")
        pad = getattr(getattr(trainer, "_tokenizer", None), "pad_token_id", None)
        self._ends = frozenset([*getattr(trainer, "eos_token_ids", []), *([pad] if pad is not None else [])])

    def close(self) -> None:
        """Close every session still open, then the client if this spec made it."""
        with self._lock:
            instances = list(self._instances)
        for env in instances:
            env._close()
        if self._owns_client:
            self._owns_client = False
            self.client.close()


# ---------------------------------------------------------------------- tool binding

def environment_class(info: EnvironmentInfo) -> type[TitoEnvironment]:
    """A TitoEnvironment subclass with one method per tool (its own class, so specs of different
    environments never share methods)."""
    methods = {spec.name: tool_method(spec) for spec in info.tools}
    name = "".join(p.capitalize() for p in info.name.replace("-", "_").split("_")) or "Env"
    return type(f"Tito{name}Environment", (TitoEnvironment,), methods)


def tool_method(spec: ToolSpec) -> Callable[..., str]:
    """A method whose signature and Google-style docstring transformers' `get_json_schema` turns
    back into the tool's schema. It forwards only the arguments the model wrote, so tito's own
    validation answers a missing or unknown one."""
    name = spec.name
    if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_") or name in _RESERVED:
        raise ValueError(f"tool {name!r} cannot be a method of a TRL environment (needs a public Python "
                         f"identifier other than {sorted(_RESERVED)}); rename it in the tito environment")
    props: dict[str, dict[str, Any]] = spec.parameters.get("properties") or {}
    required = set(spec.parameters.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    doc_args = []
    for arg in sorted(props, key=lambda a: a not in required):  # required ones first
        if not arg.isidentifier() or keyword.iskeyword(arg) or arg == "self":
            raise ValueError(f"tool {name!r}: argument {arg!r} is not a Python identifier")
        hint = _python_type(props[arg])
        default = inspect.Parameter.empty if arg in required else None
        if default is None:
            hint = hint | None
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
        annotations[arg] = hint
        desc = " ".join(str(props[arg].get("description") or props[arg].get("title") or arg).split())
        doc_args.append(f"    {arg}: {desc}")

    def method(self: TitoEnvironment, **arguments: Any) -> str:
        return self._call_tool(name, arguments)

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    description = " ".join((spec.description or f"Call the {name} tool.").split())
    method.__doc__ = description + ("\n\nArgs:\n" + "\n".join(doc_args) if doc_args else "")
    return method


def _python_type(schema: Mapping[str, Any]) -> Any:
    if "enum" in schema and schema["enum"] and all(isinstance(v, (str, int, float, bool)) for v in schema["enum"]):
        return Literal[tuple(schema["enum"])]
    t = schema.get("type")
    if isinstance(t, str) and t in _JSON_TYPES:
        if t == "array" and isinstance(schema.get("items"), dict):
            return list[_python_type(schema["items"])]
        return _JSON_TYPES[t]
    for key in ("anyOf", "oneOf"):  # pydantic's Optional[T]
        options = [o for o in schema.get(key) or [] if isinstance(o, dict) and o.get("type") != "null"]
        if len(options) == 1:
            return _python_type(options[0])
    return str
