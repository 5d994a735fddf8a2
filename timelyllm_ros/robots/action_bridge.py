"""Backend `action-bridge`: drive an existing ROS 2 robot stack (Nav2, MoveIt, a MAVROS-style
driver) with no code. A YAML skill map (config/action_bridge/example.yaml; parsed and checked by
action_bridge_config.py) binds each skill to an action, a service or a topic:

    skills:
      move_forward:                       # a MiniSpec skill, or a new one (abbrev, args)
        action: /drive_distance           # the interface's name
        type: my_robot_msgs/action/Drive  # pkg/action/Name, pkg/srv/Name or pkg/msg/Name
        goal: {distance_m: "$1"}          # $1 = the call's first argument, converted to
                                          #   the field's type
        timeout_s: 30                     # no result by then: the goal is cancelled, the call
                                          #   fails
        success: {status: SUCCEEDED, equals: {ok: true}}
        returns: travelled_m              # result field that is the skill's value

`ActionBridgeRuntime` is the interpreter's SkillRuntime (core/skills/interpreter.py): `call`
sends the goal and waits for its result, so loops and conditionals compare what the robot
stack returned. It runs its own rclpy context, node and MultiThreadedExecutor on a background
thread, so it never blocks (or needs) the caller's executor; `close()` shuts them down.
A goal is cancelled on the server when the call times out, when `safe_stop()` is called
(from any thread) while it runs, and when the backend's `stop` signal is set.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from timelyllm_ros.core.skills.base import SkillCall
from timelyllm_ros.core.skills.interpreter import (InterpreterLimits, SkillFailure,
                                                   TaskInterpreter)
from timelyllm_ros.core.skills.minispec import MiniSpecLanguage
from timelyllm_ros.core.skills.values import Value
from timelyllm_ros.robots.action_bridge_config import (STATUSES, SkillBinding, SkillMap,
                                                       load_skill_map)
from timelyllm_ros.robots.action_bridge_fields import extract

_STATUS_NAMES = {v: k.upper() for k, v in STATUSES.items() if k != "cancelled"}
_POLL_S = 0.02


def _wait(event: threading.Event, deadline: float, abort) -> str:
    """Wait for `event` until `deadline` (monotonic) or `abort()` is true:
    'done' | 'timeout' | 'aborted'."""
    while True:
        if event.is_set():
            return "done"
        if abort():
            return "aborted"
        left = deadline - time.monotonic()
        if left <= 0:
            return "timeout"
        event.wait(min(_POLL_S, left))


def _future_event(future) -> threading.Event:
    done = threading.Event()
    future.add_done_callback(lambda _f: done.set())
    return done


class ActionBridgeRuntime:
    """Skills executed through ROS 2 interfaces, as a SkillMap binds them."""

    def __init__(self, skill_map: SkillMap, stop: threading.Event | None = None):
        import rclpy
        from rclpy.executors import MultiThreadedExecutor

        self.skill_map = skill_map
        self._stop = stop or threading.Event()
        self._lock = threading.Lock()
        self._active: dict[int, Any] = {}     # goal handles in flight, by id()
        self._stop_epoch = 0                  # bumped by safe_stop(): calls in flight abort
        self._t0 = time.monotonic()
        self._context = rclpy.Context()
        rclpy.init(context=self._context)
        self._clients: dict[str, Any] = {}
        try:
            self.node = rclpy.create_node(skill_map.node_name, namespace=skill_map.namespace,
                                          context=self._context)
            for binding in skill_map.skills.values():
                self._clients[binding.skill] = self._make_client(binding)
            self._executor = MultiThreadedExecutor(num_threads=2, context=self._context)
            self._executor.add_node(self.node)
        except Exception:
            self._context.try_shutdown()
            raise
        self._thread = threading.Thread(target=self._spin, name="action-bridge", daemon=True)
        self._thread.start()
        self.history: list[tuple[str, tuple, Value]] = []

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # noqa: BLE001 - the context went down under us: we are closing
            pass

    def _make_client(self, b: SkillBinding):
        if b.kind == "action":
            from rclpy.action import ActionClient

            return ActionClient(self.node, b.type, b.interface)
        if b.kind == "service":
            return self.node.create_client(b.type, b.interface)
        return self.node.create_publisher(b.type, b.interface, 10)

    # -- SkillRuntime ------------------------------------------------------------------------

    def now(self) -> float:
        return time.monotonic() - self._t0

    def check_call(self, name: str, args: tuple) -> None:
        binding = self.skill_map.skills.get(name)
        if binding is None:
            raise SkillFailure(f"the action bridge maps no skill {name!r} (mapped: "
                               f"{', '.join(sorted(self.skill_map.skills))})")
        try:
            binding.goal_for(tuple(args))
        except ValueError as err:
            raise SkillFailure(f"{name}: {err}") from None

    def call(self, name: str, args: tuple[Value, ...]) -> Value:
        self.check_call(name, args)
        binding = self.skill_map.skills[name]
        goal = binding.goal_for(tuple(args))
        with self._lock:
            epoch = self._stop_epoch

        def abort() -> bool:
            return self._stop.is_set() or self._stop_epoch != epoch

        if abort():
            raise SkillFailure(f"{name}: stopped (safe stop, cancel or shutdown)")
        run = {"action": self._run_action, "service": self._run_service,
               "topic": self._run_topic}[binding.kind]
        value = run(binding, goal, abort)
        self.history.append((name, tuple(args), value))
        return value

    def safe_stop(self) -> None:
        """Cancel every goal in flight (the call waiting on it fails), then run the map's
        `safe_stop_skill`, if any (e.g. a hover service)."""
        with self._lock:
            self._stop_epoch += 1
            handles = list(self._active.values())
        self._cancel(handles)
        stop_skill = self.skill_map.safe_stop_skill
        if stop_skill and not self._stop.is_set():
            try:
                self.call(stop_skill, ())
            except SkillFailure:
                pass

    # -- one call per kind -------------------------------------------------------------------

    def _run_action(self, b: SkillBinding, goal, abort) -> Value:
        client = self._clients[b.skill]
        if not client.wait_for_server(timeout_sec=b.server_timeout_s):
            raise SkillFailure(f"{b.skill}: action server {b.interface} not available "
                               f"within {b.server_timeout_s:g} s")
        deadline = time.monotonic() + b.timeout_s
        sent = client.send_goal_async(goal)
        state = _wait(_future_event(sent), deadline, abort)
        if state != "done":
            sent.add_done_callback(lambda f: f.result() and f.result().accepted
                                   and f.result().cancel_goal_async())
            raise self._ended(b, state, "the goal was not answered")
        handle = sent.result()
        if not handle.accepted:
            raise SkillFailure(f"{b.skill}: goal rejected by {b.interface}")
        with self._lock:
            self._active[id(handle)] = handle
        try:
            result_future = handle.get_result_async()
            state = _wait(_future_event(result_future), deadline, abort)
            if state != "done":
                self._cancel([handle])
                raise self._ended(b, state, "goal cancelled")
        finally:
            with self._lock:
                self._active.pop(id(handle), None)
        wrapped = result_future.result()
        status, result = wrapped.status, wrapped.result
        if status not in b.statuses:
            if abort():         # cancelled by safe_stop() / stop while the result was on its way
                raise self._ended(b, "aborted", f"goal {_STATUS_NAMES.get(status, status)}")
            wanted = "/".join(_STATUS_NAMES[s] for s in b.statuses)
            raise SkillFailure(f"{b.skill}: goal ended {_STATUS_NAMES.get(status, status)}, "
                               f"not {wanted}{self._summary(result)}")
        return self._value(b, result)

    def _run_service(self, b: SkillBinding, request, abort) -> Value:
        client = self._clients[b.skill]
        if not client.wait_for_service(timeout_sec=b.server_timeout_s):
            raise SkillFailure(f"{b.skill}: service {b.interface} not available within "
                               f"{b.server_timeout_s:g} s")
        future = client.call_async(request)
        state = _wait(_future_event(future), time.monotonic() + b.timeout_s, abort)
        if state != "done":
            client.remove_pending_request(future)
            raise self._ended(b, state, "response no longer awaited")
        return self._value(b, future.result())

    def _run_topic(self, b: SkillBinding, message, abort) -> Value:
        self._clients[b.skill].publish(message)
        return True

    # -- helpers -----------------------------------------------------------------------------

    def _ended(self, b: SkillBinding, state: str, what: str) -> SkillFailure:
        if state == "timeout":
            return SkillFailure(f"{b.skill}: no result from {b.interface} within timeout_s "
                                f"{b.timeout_s:g} s ({what})")
        return SkillFailure(f"{b.skill}: stopped (safe stop, cancel or shutdown; {what})")

    def _cancel(self, handles) -> None:
        waits = [_future_event(h.cancel_goal_async()) for h in handles]
        deadline = time.monotonic() + 2.0
        for done in waits:
            done.wait(max(0.0, deadline - time.monotonic()))

    @staticmethod
    def _summary(result) -> str:
        text = str(result)
        return f" ({text[:200]})" if text else ""

    def _value(self, b: SkillBinding, result) -> Value:
        for path, expected in b.equals.items():
            try:
                got = extract(result, path)
            except (AttributeError, IndexError, TypeError) as err:
                raise SkillFailure(f"{b.skill}: result has no {self._path(path)}: {err}") \
                    from None
            if got != expected:
                raise SkillFailure(f"{b.skill}: result {self._path(path)} is {got!r}, "
                                   f"success needs {expected!r}")
        if b.returns is None:
            return True
        try:
            value = extract(result, b.returns)
        except (AttributeError, IndexError, TypeError) as err:
            raise SkillFailure(f"{b.skill}: returns {b.returns_text}: {err}") from None
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise SkillFailure(f"{b.skill}: returns {b.returns_text}: a {type(value).__name__}, "
                           "not a number, text or boolean (index a sequence: field[-1])")

    @staticmethod
    def _path(path: tuple) -> str:
        return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")

    def close(self) -> None:
        """Cancel goals in flight, stop the executor thread, destroy the node and context."""
        with self._lock:
            handles = list(self._active.values())
        if handles and self._context.ok():
            self._cancel(handles)
        self._executor.shutdown(timeout_sec=2.0)
        self._thread.join(timeout=5.0)
        for b in self.skill_map.skills.values():
            client = self._clients.get(b.skill)
            if b.kind == "action" and client is not None:
                client.destroy()
        self.node.destroy_node()
        self._context.try_shutdown()


class ActionBridgeBackend:
    """SkillBackend for the executor: `runtime` for the interpreter (one per task:
    `interpreter()`), `execute` for the flat-call path."""

    def __init__(self, skill_map: SkillMap | str | Path | Mapping,
                 stop: threading.Event | None = None,
                 limits: InterpreterLimits = InterpreterLimits()):
        if not isinstance(skill_map, SkillMap):
            skill_map = load_skill_map(skill_map)
        self.skill_map = skill_map
        self.language = MiniSpecLanguage(skill_map.specs)
        self.limits = limits
        self.runtime = ActionBridgeRuntime(skill_map, stop)

    def interpreter(self) -> TaskInterpreter:
        return TaskInterpreter(self.language, self.runtime, self.limits)

    def execute(self, calls: Sequence[SkillCall]) -> tuple[bool, str]:
        text = ";".join(",".join([c.name, *c.args]) for c in calls)
        outcome = self.interpreter().run_segment(text)
        if not outcome.success:
            return False, f"action-bridge: {outcome.message}"
        return True, (f"action-bridge: {len(outcome.calls_executed)} call(s), "
                      + ", ".join(c.line() for c in outcome.calls_executed))

    def cancel(self) -> None:
        self.runtime.safe_stop()

    def close(self) -> None:
        self.runtime.close()


def build_action_bridge(**params: Any) -> ActionBridgeBackend:
    """Entry point `action-bridge`: skill_map (a YAML path, required), max_loop_count,
    step_budget; the executor's common parameters (stop; model, time_scale, seed: unused,
    the robot stack keeps its own time) are accepted."""
    stop = params.pop("stop", None) or threading.Event()
    for unused in ("model", "exec_model", "time_scale", "seed"):
        params.pop(unused, None)
    skill_map = params.pop("skill_map", None)
    limits = {k: int(params.pop(k)) for k in ("max_loop_count", "step_budget") if k in params}
    if params:
        raise ValueError(f"{sorted(params)[0]}: not a parameter of backend 'action-bridge'")
    if not skill_map:
        raise ValueError("skill_map: required for backend 'action-bridge' (a YAML file, see "
                         "config/action_bridge/example.yaml)")
    return ActionBridgeBackend(skill_map, stop, InterpreterLimits(**limits))


__all__ = ["ActionBridgeBackend", "ActionBridgeRuntime", "build_action_bridge",
           "load_skill_map"]
