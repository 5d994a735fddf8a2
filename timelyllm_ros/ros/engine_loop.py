"""The planner's engine thread: the one thread that owns the engine and the scheduler.

It builds the engine, warms the prefix cache, then drains an inbox and ticks the scheduler. ROS
callbacks never touch the engine: they `post` a function that the engine thread runs with the
scheduler (`call` waits for its answer, for services). Segments and status changes go out
through the `sink` (the node), called on this thread.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import Counter
from typing import Any, Callable

from timelyllm_ros.core.engine.factory import build_engine
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
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.ready = threading.Event()
        self.ended = threading.Event()
        self.error: str | None = None
        self.engine = None
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

    def post(self, fn: Callable[[SegmentScheduler], Any]) -> None:
        self._inbox.put(fn)
        self._wake.set()

    def call(self, fn: Callable[[SegmentScheduler], Any], timeout_s: float = 10.0) -> Any:
        """Run `fn(scheduler)` on the engine thread and return its result (or raise what it
        raised). TimeoutError if the engine thread does not get to it in time."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def run(scheduler):
            try:
                box["value"] = fn(scheduler)
            except BaseException as err:  # noqa: BLE001 - handed back to the caller
                box["error"] = err
            finally:
                done.set()

        if not self.ready.is_set() or self.ended.is_set():
            raise Refused("planner engine is not running")
        self.post(run)
        if not done.wait(timeout_s):
            raise TimeoutError(f"engine thread busy for more than {timeout_s:.0f} s")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def stop(self, timeout_s: float = 1.5) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # ------------------------------------------------------------------ engine thread
    def _main(self) -> None:
        s = self.settings
        try:
            self._log.info(f"loading {s.engine_kind} engine ({s.engine_model}, policy {self.policy_name})")
            self.engine = build_engine(s.engine_spec, self.policy.engine_needs())
            self._sink.engine_started(self.engine)
            self.scheduler = self._new_scheduler(self.policy)
            if s.warm:
                self.scheduler.warm_prefix_cache()
        except Exception as err:  # noqa: BLE001 - reported; configure fails
            self.error = f"engine failed to start: {err}"
            self._log.fatal(f"{self.error}\n{traceback.format_exc()}")
            if self.engine is not None:
                self.engine.shutdown()
            self.ended.set()
            return
        self._update_stats(force=True)
        self.ready.set()
        scheduler = self.scheduler
        try:
            while not self._stop.is_set():
                handled = self._drain()
                scheduler = self.scheduler
                busy = scheduler.tick()
                self._update_stats(force=handled > 0)
                if not busy:
                    timer = scheduler.next_timer_s()
                    wait = 0.25 if timer is None else min(0.25, max(0.0, timer - self.engine.now()))
                    self._wake.wait(wait)
                    self._wake.clear()
        except Exception as err:  # noqa: BLE001
            self.error = f"engine loop failed: {err}"
            self._log.fatal(f"{self.error}\n{traceback.format_exc()}")
        finally:
            try:
                self.scheduler.shutdown("planner shutting down")
                self._update_stats(force=True)
            finally:
                self.engine.shutdown()
                self.ended.set()

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


class _Listener:
    def __init__(self, sink):
        self._sink = sink

    def on_segment(self, dispatch: SegmentDispatch) -> None:
        self._sink.on_segment(dispatch)

    def on_status(self, snapshot: TaskSnapshot) -> None:
        self._sink.on_status(snapshot)
