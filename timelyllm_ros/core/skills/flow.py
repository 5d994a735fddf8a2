"""How often each call of a segment is expected to run: the control-flow rule behind a segment's
execution-time estimate (ExecutionTimeModel.estimate_segment_min multiplies each call's time
by its weight).

The rule, per call, is the product over the blocks around it of:

- a loop `n{...}` whose body cannot return: n (it runs exactly n times);
- a loop whose body holds a return (`->`, an early exit, as in TypeFly's sweeping): the
  expected iterations when the exit is equally likely at every iteration or never,
  (n + 1) / 2;
- a conditional `?...{...}`: BRANCH_WEIGHT = 1, its body counts as taken. The planner cannot
  know the robot's observations; counting the body keeps the estimate at least the taken
  branch's time, and the planner's report deadline (dead-robot detection) derives from the
  estimate, so a robot running the branch is never declared dead early. (Counting half
  changed the paper workloads' scheduling, whose plans branch: the golden bench numbers.)

Calls in assignments, returns and conditions count like call statements. A high-level skill
(sweeping, orienting, ...) is one call here; its own time model (config/exec_model.yaml)
already covers the iterations of its definition. A statement after a return still counts:
the return may not fire. The weights are therefore an estimate of the expected duration of
the segment: exact for plans without early exits when their conditionals are taken.
"""

from __future__ import annotations

from typing import Iterator

from timelyllm_ros.core.skills.minispec_ast import (
    Assign,
    BoolOp,
    Call,
    CallStmt,
    Comparison,
    Condition,
    If,
    Loop,
    Program,
    Return,
)

BRANCH_WEIGHT = 1.0


def can_return(program: Program) -> bool:
    for stmt in program:
        if isinstance(stmt, Return):
            return True
        if isinstance(stmt, (Loop, If)) and can_return(stmt.body):
            return True
    return False


def loop_weight(loop: Loop) -> float:
    return (loop.count + 1) / 2 if can_return(loop.body) else float(loop.count)


def weighted_calls(program: Program, weight: float = 1.0) -> Iterator[tuple[Call, float]]:
    """(call, expected number of executions) in textual order."""
    for stmt in program:
        if isinstance(stmt, CallStmt):
            yield stmt.call, weight
        elif isinstance(stmt, (Assign, Return)):
            if isinstance(stmt.value, Call):
                yield stmt.value, weight
        elif isinstance(stmt, Loop):
            yield from weighted_calls(stmt.body, weight * loop_weight(stmt))
        else:
            # The condition is evaluated whenever the statement is reached; the body is not.
            yield from _condition_calls(stmt.condition, weight)
            yield from weighted_calls(stmt.body, weight * BRANCH_WEIGHT)


def _condition_calls(cond: Condition, weight: float) -> Iterator[tuple[Call, float]]:
    if isinstance(cond, BoolOp):
        yield from _condition_calls(cond.left, weight)
        yield from _condition_calls(cond.right, weight)
        return
    assert isinstance(cond, Comparison)
    for side in (cond.left, cond.right):
        if isinstance(side, Call):
            yield side, weight
