"""The step engine of one session: seq order, retries, and one assistant turn from ids to suffix.

A Step goes: check the seq (a retry of the last or running seq shares its answer; anything but
the next seq is refused) → parse the completion into tool calls → run them one by one in the
session's environment → render the tool results and the next assistant header to suffix ids
within the client's budget → a `StepResult` whose status says what the client does next.

No grpc here: mistakes of the client raise `RequestError`, mistakes of the model become tool
messages, and a failure after tools may have run ends the episode with status ERROR (remembered
like any answer, so a retry cannot run the calls twice).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time

from env_server.environments.base import Environment
from env_server.errors import ErrorKind, RequestError, quote
from env_server.idempotency import OnceByKey
from env_server.metrics import ServerMetrics
from env_server.rendering import RenderingContext
from tito.types import Message, StepRequest, StepResult, StepStatus, StepTiming, ToolCall, ToolResult, call_id

log = logging.getLogger(__name__)

# A suffix over this many characters of tool output may take several renders to fit its
# budget: render it in a thread so the event loop keeps serving other sessions.
_OFFLOAD_RENDER_CHARS = 32 * 1024
_NOT_RUN_AFTER_LOSS = ToolResult.error("not run, because the sandbox was lost by an earlier call.")


class Episode:
    """Owns a session's step lifecycle. Steps of one session run one at a time (the sandbox is stateful)."""

    def __init__(self, session_id: str, env: Environment, renderer: RenderingContext | None,
                 metrics: ServerMetrics, history_calls: int = 0, strict_parsing: bool = False) -> None:
        self.session_id = session_id
        self.env = env
        self.renderer = renderer
        # The tools' JSON Schemas type values the model writes as raw text (XML, GLM, pythonic formats).
        self._tool_specs = tuple(env.session_tool_specs(env.env_args))
        self.metrics = metrics
        self.done = False
        self.tool_calls_made = 0
        self.history_calls = history_calls  # tool calls in the opening messages (Kimi's templates number all calls)
        # Strict: what the deployment parser reads leniently gets an error message (the session's parsing_strict,
        # else the server's parsing.strict).
        self.strict_parsing = strict_parsing
        self.tool_turns = 0  # turns that called tools (the environment's turn_limit counts these)
        self.settled_at = time.monotonic()  # when the last step finished: the idle lease counts from here
        # The last answered (or running) seq and its answer: a retry of it replays the answer.
        self._steps: OnceByKey[int, StepResult] = OnceByKey(capacity=1, name=f"step-{session_id[:12]}")

    @property
    def busy(self) -> bool:
        latest = self._steps.latest
        return latest is not None and not latest[1].done()

    async def step(self, turn: StepRequest) -> StepResult:
        self._check_fingerprint(turn.tokenizer_fingerprint)
        if self._steps.get(turn.seq) is None:
            self._check_order(turn.seq)
        return await self._steps.run(turn.seq, functools.partial(self._run_guarded, turn))

    # ------------------------------------------------------------ admission

    def _check_fingerprint(self, fingerprint: str) -> None:
        have = self.renderer.fingerprint if self.renderer else ""
        if fingerprint and fingerprint != have:
            raise RequestError(
                ErrorKind.FAILED_PRECONDITION,
                f"tokenizer fingerprint mismatch: the request says {quote(fingerprint)} but session "
                f"{self.session_id!r} was opened with {have or 'none'!r}; open the session with the tokenizer "
                "you generate with",
            )

    def _check_order(self, seq: int) -> None:
        latest = self._steps.latest
        if latest is not None and not latest[1].done():
            running = latest[0]
            raise RequestError(
                ErrorKind.FAILED_PRECONDITION,
                f"step {running} of session {self.session_id!r} is still running; wait for its answer "
                f"(retrying seq {running} returns it) before sending seq {seq}",
            )
        last = latest[0] if latest is not None else 0
        if seq != last + 1:
            raise RequestError(
                ErrorKind.FAILED_PRECONDITION,
                f"out-of-order step: session {self.session_id!r} expects seq {last + 1} "
                f"(or {last} to replay the last answer), got {seq}",
            )
        if self.done:
            raise RequestError(
                ErrorKind.FAILED_PRECONDITION,
                f"the episode of session {self.session_id!r} is over; close it and open a new session",
            )

    # ------------------------------------------------------------ one turn

    async def _run_guarded(self, turn: StepRequest) -> StepResult:
        try:
            return await self._run_turn(turn)
        except RequestError:
            raise  # refused before any tool ran: forgotten, the client may fix and resend
        except Exception as e:
            # Tools may have run: the sandbox state is unknown, so the episode ends.
            log.exception("step %d of session %s failed", turn.seq, self.session_id)
            self.metrics.errors.labels("step:internal").inc()
            self.done = True
            return StepResult(
                seq=turn.seq, status=StepStatus.ERROR,
                detail=f"the server failed while running this step ({type(e).__name__}: {e}); "
                "the session is over, open a new one",
            )
        finally:
            self.settled_at = time.monotonic()

    async def _run_turn(self, turn: StepRequest) -> StepResult:
        started = time.perf_counter()
        calls_before = self.history_calls + self.tool_calls_made
        calls, final_text, repairs = self._calls_of(turn, calls_before)
        parsed_at = time.perf_counter()
        if not calls:
            self.done = True
            ended = await self._end(StepResult(seq=turn.seq, status=StepStatus.EPISODE_END), final_text)
            done_at = time.perf_counter()
            return dataclasses.replace(ended, timing=_timing(started, parsed_at, done_at, done_at))

        results = await self._run_calls(calls)
        self.tool_turns += 1
        tools_done = time.perf_counter()
        messages = tuple(Message.tool_result(c, r.content) for c, r in zip(calls, results))
        rewards = [r.reward for r in results if r.reward is not None]
        result = StepResult(
            seq=turn.seq, status=StepStatus.OK, tool_calls=tuple(calls), tool_messages=messages,
            reward=rewards[-1] if rewards else None, truncated=any(r.truncated for r in results),
        )
        lost = next((r for r in results if r.lost), None)
        limit = self.env.turn_limit()
        if lost is not None:
            result = dataclasses.replace(result, status=StepStatus.SANDBOX_LOST,
                                         detail=f"sandbox lost: {lost.lost_reason}; open a new session")
        elif any(r.done for r in results):
            result = dataclasses.replace(result, status=StepStatus.EPISODE_END)
        elif limit is not None and self.tool_turns >= limit:
            # The last turn the environment allows: the episode ends, scored as if the model had ended it.
            result = await self._end(dataclasses.replace(result, status=StepStatus.EPISODE_END), "")
        elif self.renderer is not None:
            result = await self._with_suffix(result, turn.max_suffix_tokens, calls_before)
        self.done = result.done
        if repairs:  # for the rollout's record: the calls ran as the deployment parser reads them
            note = "parser repairs (read as the deployment parser reads them): " + "; ".join(repairs)
            result = dataclasses.replace(result, detail=f"{result.detail}; {note}" if result.detail else note)
        return dataclasses.replace(result, timing=_timing(started, parsed_at, tools_done, time.perf_counter()))

    async def _end(self, result: StepResult, final_text: str) -> StepResult:
        """`result` ended by the environment's `end(final_text)`: EPISODE_END with its reward and what it said
        (for the record), or ERROR when the environment could not score it (no reward that is not the model's)."""
        end = await self.env.end(final_text)
        if end.lost:
            return dataclasses.replace(result, status=StepStatus.ERROR, reward=None,
                                       detail=f"the environment could not end the episode: {end.lost_reason}")
        return dataclasses.replace(result, status=StepStatus.EPISODE_END, reward=end.reward, detail=end.content)

    def _calls_of(self, turn: StepRequest, calls_before: int) -> tuple[list[ToolCall], str, list[str]]:
        """The turn's tool calls (ids assigned, malformed ones marked), its final text and the parser's repairs."""
        if not turn.completion_ids:
            calls = [
                dataclasses.replace(
                    c, id=c.id or call_id(turn.seq, i),
                    error=None if c.name else 'a tool call has no tool name; write {"name": ..., "arguments": {...}}',
                )
                for i, c in enumerate(turn.tool_calls)
            ]
            return calls, turn.assistant_content, []
        if self.renderer is None:
            raise RequestError(
                ErrorKind.FAILED_PRECONDITION,
                "completion_ids need a tokenizer: open the session with a tokenizer_fingerprint "
                "(RegisterTokenizer), or send parsed tool_calls instead",
            )
        try:
            parsed = self.renderer.parse_completion(list(turn.completion_ids), seq=turn.seq, tools=self._tool_specs,
                                                    calls_before=calls_before, strict=self.strict_parsing)
        except ValueError as e:
            raise RequestError(ErrorKind.INVALID_ARGUMENT, f"completion_ids: {e}") from e
        if not parsed.stopped:
            raise RequestError(
                ErrorKind.INVALID_ARGUMENT,
                "completion_ids do not end with a stop token "
                f"({', '.join(map(str, self.renderer.stop_token_ids))}): the assistant turn is unfinished, "
                "so its tool calls are not run. A turn cut by length ends the rollout as truncated; "
                "send the ids exactly as generated, stop token included",
            )
        return list(parsed.tool_calls), parsed.content, parsed.repairs

    async def _run_calls(self, calls: list[ToolCall]) -> list[ToolResult]:
        """One sandbox per session: parallel calls run in order; none runs after the sandbox is lost."""
        results: list[ToolResult] = []
        for call in calls:
            if results and results[-1].lost:
                results.append(_NOT_RUN_AFTER_LOSS)
                continue
            if call.error:
                outcome, result = "malformed", ToolResult.error(call.error)
            else:
                result = await self.env.call_tool(call)
                outcome = "lost" if result.lost else ("error" if result.is_error else "ok")
            self.tool_calls_made += 1
            # Bounded label values: the model may write any name.
            tool = call.name if self.env.has_tool(call.name) else "other"
            self.metrics.tool_calls.labels(self.env.name, tool, outcome).inc()
            results.append(result)
        return results

    async def _with_suffix(self, result: StepResult, budget: int | None, calls_before: int) -> StepResult:
        assert self.renderer is not None
        render = functools.partial(self.renderer.render_suffix, result.tool_calls, result.tool_messages, budget,
                                   later_round=calls_before > 0, calls_before=calls_before)
        big = sum(len(m.content) for m in result.tool_messages) > _OFFLOAD_RENDER_CHARS
        suffix = await asyncio.to_thread(render) if big else render()
        if suffix.overflow:
            return dataclasses.replace(
                result, status=StepStatus.SUFFIX_OVERFLOW,
                detail=f"not even the minimal tool-result suffix fits max_suffix_tokens={budget}")
        return dataclasses.replace(result, suffix_ids=tuple(suffix.ids), tool_messages=suffix.tool_messages,
                                   truncated=result.truncated or suffix.truncated)


def _timing(started: float, parsed: float, tools: float, rendered: float) -> StepTiming:
    ms = 1000.0
    return StepTiming(parse_ms=(parsed - started) * ms, tools_ms=(tools - parsed) * ms,
                      render_ms=(rendered - tools) * ms, total_ms=(rendered - started) * ms)
