"""A fleet of simulated engines run in parallel, in virtual time, behind the replica router.

`ReplicaEngine` (core/engine/replicas.py) steps real servers one after another: each is a
process of its own that works while the others are asked, so their steps overlap in wall time
anyway. Simulated engines do no work between calls; stepped one after another on one clock,
N replicas would take N times as long as one. `SimulatedFleet` makes them overlap the way N
GPUs do, as a discrete-event simulation:

- every replica keeps its own clock; the fleet's clock (`now()`) is the common clock the
  scheduler sees;
- `step()` first starts a step on every replica that has work and none in flight (an idle
  replica is first brought up to the common clock: it starts when the work arrived, not when
  it last stepped). A started step is computed at once, but its outputs are held back until
  the step's end on that replica's clock. Then `step()` releases the step in flight that ends
  first: the common clock moves to its end, and its outputs are what the scheduler sees, at
  that time;
- so the scheduler reacts to each replica's outputs when that replica's step ends, and the
  replica's next step starts only after the scheduler has acted on them (a suspension at a
  segment boundary is exact, as on one engine);
- a run added while its replica is in the middle of a step joins that replica's next step
  (the engine's clock is already at the step's end: the run arrives then, as in vLLM);
- an abort (cancel, preemption, a discarded suspension) of a run whose replica has a step in
  flight drops that run's held output: the scheduler no longer knows the run.

Placement is the router's (inherited from `ReplicaEngine`): a new plan goes to the replica with
the most free KV, then free slots, then the fewest plans; each resume goes to its task's home.

What the scheduler is told about the fleet: KV blocks and slots summed over the replicas, the
profile of one replica, which replica runs each run and would run each queued one
(`replica_for`), and, as `last_step_timing()`, the released step's duration, its replica and
that replica's batch (`StepTiming.replica`, `replica_batch_size`), with the whole fleet's
running count as `batch_size` for an admission that sees the fleet as one engine, and each
replica's free KV blocks and slots (`replica_rooms`). The default policy's admission learns each
replica's step time against that replica's batch
(`core.policies.work_conserving.ResponseFirstAdmission`); `timelyllm-pred` also takes its
decision per replica, on that replica's batch, queue and room (core/policies/predictive.py). Between releases, KV use and running
counts are read from the engines, whose state is that at the end of their step in flight (at
most one step ahead of the common clock, like the metrics a real router reads).

One replica behaves exactly as the engine alone (test_fleet.py checks it step by step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from timelyllm_ros.core.engine.base import EngineAdapter, EngineOutput, ReplicaRoom, StepTiming
from timelyllm_ros.core.engine.replicas import Replica, ReplicaEngine


@dataclass
class _Flight:
    """One replica's step, computed, whose outputs wait for its end on the common clock."""

    end_s: float
    outputs: list[EngineOutput]
    timing: StepTiming
    aborted: set[str] = field(default_factory=set)


class SimulatedFleet(ReplicaEngine):
    """`ReplicaEngine` over simulated engines whose steps overlap in virtual time (module
    docstring). `build(i)` makes replica i's engine, each with its own KV and slots."""

    name = "sim-fleet"

    def __init__(self, build: Callable[[int], EngineAdapter], replicas: int):
        if not (isinstance(replicas, int) and replicas >= 1):
            raise ValueError(f"replicas: must be an integer >= 1, got {replicas!r}")
        super().__init__([Replica(f"replica{i}", build=(lambda i=i: build(i)))
                          for i in range(replicas)])
        self._clock = max(r.engine.now() for r in self.replicas)
        self._in_flight: dict[int, _Flight] = {}  # replica index -> its step in flight
        self.steps_per_replica = [0] * replicas

    # -- clock -----------------------------------------------------------------------------
    def now(self) -> float:
        return self._clock

    def advance_idle(self, until: float) -> None:
        # Idle replicas are brought up to the common clock when they next get work.
        if until > self._clock:
            self._clock = float(until)

    def _submit_to(self, replica: Replica) -> None:
        if self._index[id(replica)] not in self._in_flight:
            replica.engine.advance_idle(self._clock)

    # -- requests --------------------------------------------------------------------------
    def abort_request(self, request_id: str) -> None:
        replica = self._where.get(request_id)
        if replica is not None:
            flight = self._in_flight.get(self._index[id(replica)])
            if flight is not None:
                flight.aborted.add(request_id)
        super().abort_request(request_id)

    def step(self) -> list[EngineOutput]:
        for index, replica in enumerate(self.replicas):
            engine = replica.engine
            if index in self._in_flight or not engine.has_unfinished_requests():
                continue
            engine.advance_idle(self._clock)
            outputs = engine.step()
            self._in_flight[index] = _Flight(engine.now(), outputs, engine.last_step_timing())
            self.steps_per_replica[index] += 1
        if not self._in_flight:
            self._last_timing = StepTiming()
            return []
        index = min(self._in_flight, key=lambda i: (self._in_flight[i].end_s, i))
        flight = self._in_flight.pop(index)
        self._clock = max(self._clock, flight.end_s)
        outputs = [o for o in flight.outputs if o.request_id not in flight.aborted]
        for out in outputs:
            self._note_output(out)
        self._last_timing = StepTiming(
            duration_s=flight.timing.duration_s, batch_size=self.num_running(),
            prefill_tokens=flight.timing.prefill_tokens, extra=dict(flight.timing.extra),
            replica=index, replica_batch_size=flight.timing.batch_size)
        return outputs

    def has_unfinished_requests(self) -> bool:
        return bool(self._in_flight) or super().has_unfinished_requests()

    def replica_rooms(self) -> list[ReplicaRoom]:
        """Each replica's free KV blocks and slots as its engine reports them (the state at the
        end of its step in flight, like the rest of what the scheduler reads between releases)."""
        rooms = []
        for replica in self.replicas:
            engine = replica.engine
            if engine is None or not replica.up():
                rooms.append(ReplicaRoom(0, 0))
                continue
            seqs = engine.capabilities().max_num_seqs
            rooms.append(ReplicaRoom(
                engine.kv_usage().free_blocks,
                None if seqs is None else max(0, seqs - engine.num_running())))
        return rooms

    def in_flight(self) -> int:
        """Replicas with a step in flight (computed, not yet released)."""
        return len(self._in_flight)

    def describe(self) -> dict:
        return {**super().describe(), "engine": self.name,
                "steps_per_replica": list(self.steps_per_replica)}


def simulated_fleet(build: Callable[[], EngineAdapter], replicas: int) -> EngineAdapter:
    """`replicas` engines from `build` as one: the engine itself for one replica (nothing in
    between), else a `SimulatedFleet`."""
    if replicas == 1:
        return build()
    return SimulatedFleet(lambda _i: build(), replicas)


def replica_engines(fleet: EngineAdapter) -> Sequence[EngineAdapter]:
    """The engines of a fleet (the engine itself when it is one)."""
    if isinstance(fleet, ReplicaEngine):
        return [r.engine for r in fleet.replicas if r.engine is not None]
    return [fleet]
