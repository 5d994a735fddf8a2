"""The planner's engine thread: the one thread that owns the engine and the scheduler.

It builds the engine, warms the prefix cache, then drains an inbox and ticks the scheduler. ROS
callbacks never touch the engine: they `post` a function that the engine thread runs with the
scheduler (`call` waits for its answer, for services). Segments and status changes go out
through the `sink` (the node), called on this thread.

Ending, two ways:
- `stop()` (planner shutdown, cleanup): every active task ends `cancelled` with the reason, then
  the engine is released. `tasks_ended` is set as soon as the tasks have ended, before the
  (possibly slow) engine shutdown, so the node can tell its clients and robots at once.
- an engine fault (`EngineFault` from the fence around the engine, fault_fence.py; or any other
  exception escaping the scheduler, which leaves its state untrusted): every active task ends
  `failed` with the cause, the engine is released, and the sink's `engine_failed(reason)` is
  called so the node can go through ErrorProcessing. The engine thread never runs on after a
  fault: what the engine held is gone with it.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import Counter
from typing import Any, Callable

from timelyllm_ros.core.engine.factory import build_engine
from timelyllm_ros.core.engine.fault_fence import FencedEngine
from timelyllm_ros.core.policies.registry import get_policy
from timelyllm_ros.core.sched.interface import SegmentDispatch
from timelyllm_ros.core.sched.scheduler import SegmentScheduler
from timelyllm_ros.core.task import TaskSnapshot

STATS_PERIOD_S = 0.25


class Refused(Exception):
    """A request the engine thread turned down; the message is the reason for the caller."""


class EngineLoop:
    def __init__(self, settings, sink, log):
        self.settings = settings
        self._sink = sink
        self._log = log
        self.policy = get_policy(settings.policy_name)
        self.policy_name = settings.policy_name
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._stop_reason = "planner shutting down"
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.tasks_ended = threading.Event()
        self.ended = threading.Event()
        self.error: str | None = None
        self.engine: FencedEngine | None = None
        self.scheduler: SegmentScheduler | None = None
        # Published by the ROS side (metrics, diagnostics, top); replaced whole, never mutated.
        self.stats: dict[str, Any] = {}
        self._stats_at = 0.0
        self._thread = threading.Thread(target=self._main, name="engine", daemon=True)

    # ------------------------------------------------------------------ any thread
    def start(self) -> "EngineLoop":
        self._thread.start()
        return self

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the engine is up; False if it failed (see `error`) or took too long."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.ready.wait(0.2):
                return True
            if self.ended.is_set():
                return False
        return False

    def post(self, fn: Callable[[SegmentScheduler], Any]) -> bool:
        """Hand `fn` to the engine thread; False (and dropped) once the loop is ending."""
        if self.tasks_ended.is_set():
            return False
        self._inbox.put(fn)
        self._wake.set()
        return True

    def call(self, fn: Callable[[SegmentScheduler], Any], timeout_s: float = 10.0) -> Any:
        """Run `fn(scheduler)` on the engine thread and return its result (or raise what it
        raised). TimeoutError if the engine thread does not get to it in time; Refused if the
        engine is not running or stops first."""
        if not self.ready.is_set() or self.ended.is_set() or self._stop.is_set():
            raise Refused(self.error or "planner engine is not running")
        request = _Call(fn)
        self.post(request)
        if not request.done.wait(timeout_s):
            raise TimeoutError(f"engine thread busy for more than {timeout_s:.0f} s")
        if request.error is not None:
            raise request.error
        return request.value

    def stop(self, timeout_s: float = 1.5, reason: str = "planner shutting down") -> bool:
        """End every task (`reason`) and release the engine; True if the tasks ended within
        `timeout_s` (the engine's own shutdown may take longer: the thread is a daemon)."""
        self._stop_reason = reason
        self._stop.set()
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        ended = self.tasks_ended.wait(timeout_s) or not self._thread.is_alive()
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return ended

    def inject_fault(self, operation: str) -> None:
        """Make the engine's next `operation` fail (fault drills; FencedEngine.inject)."""
        if self.engine is None:
            raise Refused("planner engine is not running")
        self.engine.inject(operation)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ engine thread
    def _main(self) -> None:
        s = self.settings
        try:
            self._log.info(f"loading {s.engine_kind} engine ({s.engine_model}, policy {self.policy_name})")
            self.engine = FencedEngine(build_engine(s.engine_spec, self.policy.engine_needs()))
            self._sink.engine_started(self.engine)
            self.scheduler = self._new_scheduler(self.policy)
            if s.warm:
                self.scheduler.warm_prefix_cache()
        except Exception as err:  # noqa: BLE001 - reported; configure fails
            self.error = f"engine failed to start: {err}"
            self._log.fatal(f"{self.error}\n{traceback.format_exc()}")
            if self.engine is not None:
                self._shutdown_engine()
            self.tasks_ended.set()
            self.ended.set()
            return
        self._update_stats(force=True)
        self.ready.set()
        fault: str | None = None
        try:
            while not self._stop.is_set():
                handled = self._drain()
                scheduler = self.scheduler
                busy = scheduler.tick() if self.engine.fault is None else False
                if self.engine.fault is not None:  # also when a request's handler caught it
                    raise self.engine.fault
                self._update_stats(force=handled > 0)
                if not busy:
                    timer = scheduler.next_timer_s()
                    wait = 0.25 if timer is None else min(0.25, max(0.0, timer - self.engine.now()))
                    self._wake.wait(wait)
                    self._wake.clear()
        except Exception as err:  # noqa: BLE001 - an engine fault, or a scheduler bug
            fault = str(err) if self.engine.fault is err else f"engine loop failed: {type(err).__name__}: {err}"
            self.error = fault
            self._log.fatal(f"{fault}\n{traceback.format_exc()}")
        finally:
            try:
                if fault is None:
                    self.scheduler.shutdown(self._stop_reason)
                else:
                    self.scheduler.shutdown(fault, trigger="fail")
                self._drain_refusing()
                self._update_stats(force=True)
            finally:
                self.tasks_ended.set()
                if fault is not None:
                    self._sink.engine_failed(fault)
                self._shutdown_engine()
                self.ended.set()

    def _shutdown_engine(self) -> None:
        try:
            self.engine.shutdown()
        except Exception as err:  # noqa: BLE001 - a failed engine may fail to shut down too
            self._log.error(f"engine shutdown raised {type(err).__name__}: {err}")

    def _drain_refusing(self) -> None:
        """Requests posted while the loop ended: let `call`ers know at once (not by timeout);
        work that was only posted (reports, goals) has nothing left to apply to."""
        while True:
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(fn, _Call):
                fn.refuse(Refused(self.error or "planner engine stopped"))

    def _drain(self) -> int:
        handled = 0
        while True:
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return handled
            handled += 1
            try:
                fn(self.scheduler)
            except Exception as err:  # noqa: BLE001 - one bad request must not stop the loop
                self._log.error(f"engine-thread request failed: {err}\n{traceback.format_exc()}")

    def _new_scheduler(self, policy) -> SegmentScheduler:
        s = self.settings
        return SegmentScheduler(self.engine, policy, s.skill_sets, s.exec_model,
                                _Listener(self._sink), s.scheduler_config)

    def replace_policy(self, scheduler: SegmentScheduler, name: str) -> None:
        """On the engine thread: serve with policy `name` from now on. Refused (Refused, with
        the reason) while tasks are active or when it needs another engine."""
        policy = get_policy(name)
        active = scheduler.active_tasks()
        if active:
            raise Refused(f"{len(active)} task(s) active; change the policy when the planner is idle")
        if self.settings.engine_fit(policy) != self.settings.engine_fit(self.policy):
            raise Refused(f"{name!r} needs another engine set-up than {self.policy_name!r} "
                          "(vLLM scheduling policy or simulated engine); set it, then configure")
        new = self._new_scheduler(policy)
        new.tasks.update(scheduler.tasks)  # finished tasks: duplicate ids stay refused
        self.scheduler, self.policy, self.policy_name = new, policy, name
        self._update_stats(force=True)

    def _update_stats(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._stats_at < STATS_PERIOD_S:
            return
        self._stats_at = now
        sch = self.scheduler
        kv = sch.engine.kv_usage()
        overhead = sch.fetch_overhead_s[-200:]
        states = Counter(t.state for t in sch.active_tasks())
        self.stats = {
            "policy": self.policy_name, "engine": sch.engine.name, "queued": sch.queue_length(),
            "running": len(sch.running_request_ids()), "active_tasks": sum(states.values()),
            "tasks_total": len(sch.tasks), "kv_free_blocks": int(kv.free_blocks),
            "kv_total_blocks": int(kv.total_blocks),
            "fetch_overhead_ms": 1e3 * sum(overhead) / len(overhead) if overhead else 0.0,
            "states": dict(states),
        }


class _Call:
    """A request whose caller waits on `done` for its value or error."""

    def __init__(self, fn: Callable[[SegmentScheduler], Any]):
        self.fn = fn
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def __call__(self, scheduler: SegmentScheduler) -> None:
        try:
            self.value = self.fn(scheduler)
        except BaseException as err:  # noqa: BLE001 - handed back to the caller
            self.error = err
        finally:
            self.done.set()

    def refuse(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class _Listener:
    def __init__(self, sink):
        self._sink = sink

    def on_segment(self, dispatch: SegmentDispatch) -> None:
        self._sink.on_segment(dispatch)

    def on_status(self, snapshot: TaskSnapshot) -> None:
        self._sink.on_status(snapshot)
