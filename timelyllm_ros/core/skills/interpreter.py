"""Running a plan on a robot with MiniSpec semantics, segment by segment.

    interp = TaskInterpreter(MINISPEC, runtime, InterpreterLimits())   # one per task
    outcome = interp.run_segment("_1=s,bottle;", cancel_event=None, on_call=print)
    outcome = interp.run_segment("?_1==True{o,bottle;a}")   # _1 is still set

- loops repeat their body; conditionals compare the values skills returned (values.py);
- variables keep their values across the segments of one task (the interpreter's `env`);
- high-level skills (sweeping, orienting, ...) run their MiniSpec definition with `$1` bound
  to the arguments, in a scope of their own (as TypeFly does); their return is the call's value;
- a return (`->`) at plan level ends the plan: `ended_by_return`, later segments are skipped.

The robot is a `SkillRuntime`: it executes low-level skills by full name and returns their
values. A segment fails, with a message naming the statement and the cause, when it does not
parse, names an unknown skill, has a loop over `max_loop_count`, reads a variable before it is
set, exceeds the step budget, is cancelled, or a skill fails (the runtime raises SkillFailure,
e.g. an argument out of the robot's range). Before executing anything the interpreter asks the
runtime to check every call whose arguments are literals (`check_call`), so a segment with
`mf,900` on a Tello fails before it moves. After any failure it calls `runtime.safe_stop()`
(hover / hold), and the runtime stays usable.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

from timelyllm_ros.core.skills.base import SkillSyntaxError
from timelyllm_ros.core.skills.minispec_ast import (
    Assign,
    BoolOp,
    Call,
    CallStmt,
    Condition,
    If,
    Literal,
    Loop,
    Operand,
    Param,
    Program,
    Return,
    Statement,
    Var,
    call_text,
    head_text,
    statement_text,
    walk_calls,
)
from timelyllm_ros.core.skills.minispec_skills import SkillSpec, lookup
from timelyllm_ros.core.skills.values import ComparisonError, Value, compare, format_value


class SkillFailure(Exception):
    """Raised by a runtime when a skill cannot be executed or failed; the message says why."""


class SkillRuntime(Protocol):
    """A robot as the interpreter sees it."""

    def call(self, name: str, args: tuple[Value, ...]) -> Value:
        """Execute one low-level skill (full name, e.g. "move_forward") to completion and
        return its value; raise SkillFailure on failure."""

    def now(self) -> float:
        """Seconds on the robot's clock (virtual for simulated robots)."""

    def safe_stop(self) -> None:
        """Bring the robot to a safe state after a failure (a drone hovers)."""


class PlanLanguage(Protocol):
    def program(self, text: str) -> Program: ...


@dataclass(frozen=True)
class InterpreterLimits:
    max_loop_count: int = 100
    step_budget: int = 5000        # statements executed per segment, nested ones included
    max_call_depth: int = 4        # high-level skills calling high-level skills


@dataclass(frozen=True)
class ExecutedCall:
    statement: str                 # the call as written, e.g. `tc,45`
    name: str                      # full skill name
    args: tuple[Value, ...]
    value: Value
    duration_s: float
    depth: int = 0                 # > 0 inside a high-level skill's definition

    def line(self) -> str:
        args = ",".join(format_value(a) for a in self.args)
        return f"{'  ' * self.depth}{self.name}({args}) -> {format_value(self.value)}"


@dataclass(frozen=True)
class SegmentOutcome:
    success: bool
    ended_by_return: bool
    returned_value: Value
    values: dict[str, Value]
    message: str
    calls_executed: tuple[ExecutedCall, ...]
    duration_s: float
    failed_statement: str | None = None
    steps: int = 0

    @property
    def plan_ended(self) -> bool:
        """Nothing after this segment will run: the plan returned or failed."""
        return self.ended_by_return or not self.success


class _Failed(Exception):
    def __init__(self, statement: str, cause: str):
        super().__init__(f"statement `{statement}`: {cause}")
        self.statement = statement


class _Returned(Exception):
    def __init__(self, value: Value):
        self.value = value


@dataclass
class _Run:
    cancel: threading.Event | None
    on_call: Callable[[ExecutedCall], None] | None
    steps: int = 0
    calls: list[ExecutedCall] = field(default_factory=list)


class TaskInterpreter:
    """One task's plan on one robot; `run_segment` never raises."""

    def __init__(self, language: PlanLanguage, runtime: SkillRuntime,
                 limits: InterpreterLimits = InterpreterLimits()):
        self.language = language
        self.runtime = runtime
        self.limits = limits
        self.skills: Mapping[str, SkillSpec] = getattr(language, "skills", {}) or {}
        self._text = getattr(language, "call_text", call_text)
        self.env: dict[str, Value] = {}
        self.ended = False
        self.returned_value: Value = None

    # -- the API ------------------------------------------------------------------------------

    def run_segment(self, text: str, cancel_event: threading.Event | None = None,
                    on_call: Callable[[ExecutedCall], None] | None = None) -> SegmentOutcome:
        start = self.runtime.now()
        run = _Run(cancel_event, on_call)
        if self.ended:
            return self._outcome(run, start, True, "plan already ended by a return; "
                                 "segment not executed", ended=True)
        try:
            program = self.language.program(text)
        except SkillSyntaxError as err:
            stmt = _statement_at(self.language, text, err.position)
            return self._outcome(run, start, False, f"segment does not parse: statement "
                                 f"`{stmt}`: {err}", failed=stmt)
        try:
            self._precheck(program)
            self._body(program, self.env, (), 0, run)
        except _Returned as ret:
            self.ended, self.returned_value = True, ret.value
            return self._outcome(run, start, True, f"plan returned {format_value(ret.value)}",
                                 ended=True)
        except _Failed as fail:
            self._safe_stop()
            return self._outcome(run, start, False, str(fail), failed=fail.statement)
        except Exception as err:  # noqa: BLE001 - a runtime's bug must not kill the executor
            self._safe_stop()
            return self._outcome(run, start, False, f"internal error: {type(err).__name__}: {err}")
        return self._outcome(run, start, True,
                             f"{len(run.calls)} call(s), {run.steps} statement(s)")

    # -- execution ----------------------------------------------------------------------------

    def _precheck(self, program: Program) -> None:
        """Static checks before the robot moves: loop counts, literal arguments."""
        for stmt in _statements(program):
            if isinstance(stmt, Loop) and stmt.count > self.limits.max_loop_count:
                raise _Failed(head_text(stmt), f"loop count {stmt.count} over the maximum "
                              f"{self.limits.max_loop_count}")
        check = getattr(self.runtime, "check_call", None)
        if check is None:
            return
        for call in walk_calls(program):
            if all(isinstance(a, Literal) for a in call.args):
                name = self._spec_name(call)
                if self._high_level(call) is None:
                    try:
                        check(name, tuple(a.value for a in call.args))
                    except SkillFailure as err:
                        raise _Failed(self._text(call), f"{err} (nothing executed)") from None

    def _body(self, program: Program, env: dict, params: tuple, depth: int, run: _Run) -> None:
        for stmt in program:
            self._statement(stmt, env, params, depth, run)

    def _statement(self, stmt: Statement, env: dict, params: tuple, depth: int,
                   run: _Run) -> None:
        run.steps += 1
        if run.steps > self.limits.step_budget:
            raise _Failed(head_text(stmt), f"step budget of {self.limits.step_budget} "
                          "statements exhausted")
        if run.cancel is not None and run.cancel.is_set():
            raise _Failed(head_text(stmt), "cancelled")
        if isinstance(stmt, CallStmt):
            self._call(stmt.call, env, params, depth, run)
        elif isinstance(stmt, Assign):
            env[stmt.var.name] = self._operand(stmt.value, env, params, depth, run, stmt)
        elif isinstance(stmt, Return):
            raise _Returned(self._operand(stmt.value, env, params, depth, run, stmt))
        elif isinstance(stmt, Loop):
            # The maximum is for the plan's loops; skill definitions are configuration.
            if depth == 0 and stmt.count > self.limits.max_loop_count:
                raise _Failed(head_text(stmt), f"loop count {stmt.count} over the maximum "
                              f"{self.limits.max_loop_count}")
            for _ in range(stmt.count):
                self._body(stmt.body, env, params, depth, run)
        else:
            assert isinstance(stmt, If)
            if self._condition(stmt.condition, env, params, depth, run, stmt):
                self._body(stmt.body, env, params, depth, run)

    def _condition(self, cond: Condition, env, params, depth, run, stmt) -> bool:
        if isinstance(cond, BoolOp):
            left = self._condition(cond.left, env, params, depth, run, stmt)
            if cond.op == "&" and not left:
                return False
            if cond.op == "|" and left:
                return True
            return self._condition(cond.right, env, params, depth, run, stmt)
        a = self._operand(cond.left, env, params, depth, run, stmt)
        b = self._operand(cond.right, env, params, depth, run, stmt)
        try:
            return compare(a, cond.op, b)
        except ComparisonError as err:
            raise _Failed(head_text(stmt), str(err)) from None

    def _operand(self, op: Operand, env, params, depth, run, stmt) -> Value:
        if isinstance(op, Call):
            return self._call(op, env, params, depth, run)
        return self._value(op, env, params, head_text(stmt))

    def _value(self, v, env: dict, params: tuple, where: str) -> Value:
        if isinstance(v, Literal):
            return v.value
        if isinstance(v, Var):
            if v.name not in env:
                raise _Failed(where, f"variable {v.name} read before it is set")
            return env[v.name]
        assert isinstance(v, Param)
        if not 1 <= v.index <= len(params):
            raise _Failed(where, f"parameter ${v.index} not given")
        return params[v.index - 1]

    def _spec_name(self, call: Call) -> str:
        spec = lookup(self.skills, call.name) if self.skills else None
        return spec.name if spec is not None else call.name

    def _high_level(self, call: Call) -> SkillSpec | None:
        spec = lookup(self.skills, call.name) if self.skills else None
        return spec if spec is not None and spec.high_level else None

    def _call(self, call: Call, env: dict, params: tuple, depth: int, run: _Run) -> Value:
        where = self._text(call)
        args = tuple(self._value(a, env, params, where) for a in call.args)
        spec = self._high_level(call)
        name = self._spec_name(call)
        began = self.runtime.now()
        if spec is not None:
            if depth >= self.limits.max_call_depth:
                raise _Failed(where, f"high-level skills nested deeper than "
                              f"{self.limits.max_call_depth}")
            index = len(run.calls)
            value: Value = None
            try:
                self._body(spec.body, {}, args, depth + 1, run)
            except _Returned as ret:
                value = ret.value
            except _Failed as fail:
                raise _Failed(f"{where}` > `{fail.statement}",
                              str(fail).split(": ", 1)[1]) from None
            record = ExecutedCall(where, name, args, value, self.runtime.now() - began, depth)
            run.calls.insert(index, record)
        else:
            try:
                value = self.runtime.call(name, args)
            except SkillFailure as err:
                raise _Failed(where, str(err) or type(err).__name__) from None
            record = ExecutedCall(where, name, args, value, self.runtime.now() - began, depth)
            run.calls.append(record)
        if run.on_call is not None:
            run.on_call(record)
        return value

    # -- outcome ------------------------------------------------------------------------------

    def _safe_stop(self) -> None:
        try:
            self.runtime.safe_stop()
        except Exception:  # noqa: BLE001 - best effort; the failure is already reported
            pass

    def _outcome(self, run: _Run, start: float, success: bool, message: str, *,
                 ended: bool = False, failed: str | None = None) -> SegmentOutcome:
        return SegmentOutcome(
            success=success, ended_by_return=ended,
            returned_value=self.returned_value if ended else None, values=dict(self.env),
            message=message, calls_executed=tuple(run.calls),
            duration_s=max(0.0, self.runtime.now() - start), failed_statement=failed,
            steps=run.steps)


def _statements(program: Program):
    for stmt in program:
        yield stmt
        if isinstance(stmt, (Loop, If)):
            yield from _statements(stmt.body)


def _statement_at(language, text: str, position: int | None) -> str:
    """The top-level statement of `text` around a character position (for parse errors)."""
    pos = 0
    while (end := language.next_boundary(text, pos)) is not None:
        if position is not None and position < end:
            return text[pos:end].strip()
        pos = end
    return text[pos:].strip() or text.strip()


__all__ = ["ExecutedCall", "InterpreterLimits", "SegmentOutcome", "SkillFailure",
           "SkillRuntime", "TaskInterpreter", "statement_text"]
