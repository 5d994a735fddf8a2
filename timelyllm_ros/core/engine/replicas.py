"""`engine.replicas`: several engines (vLLM servers) behind one EngineAdapter.

How a fleet outgrows one GPU: each replica is a server of its own (itself tensor- or
data-parallel vLLM if need be, which stays vLLM's job), and this router spreads plans over them:
- a new plan (a run whose task has no replica yet) goes to the healthy replica with the most free
  capacity: free KV fraction, then free slots, then the fewest plans placed on it;
- every later run of the same task (each resume) goes to the replica that served the task
  before, because that is where its KV (prefix cache or parked session) is. Runs are named
  `<task>#<n>` by the scheduler; the part before the last `#` is the affinity key;
- suspend / resume / eviction calls go to the replica holding the run.

Faults (the documented choice): a replica whose server is down at start is left out and probed
again every `reprobe_s`; at least one must come up. A replica that dies mid-plan ends the runs
it was generating with `finish_reason="error"` and the reason (they fail: their partial output is
already with the scheduler and cannot be replayed elsewhere token for token); its suspended plans
*move*: their next run goes to another replica (a resume is a new request with the token ids, so
only the prefix cache is lost, paid as a prefill there). New plans avoid it until a probe finds
it healthy again. Nothing is kept for a dead replica's runs once they have failed or moved.

The placement (`_route`, `_pick`, `_capacity`) is the one the simulated fleet inherits
(`core.engine.sim.fleet.SimulatedFleet`, which runs its replicas in parallel in virtual time),
so what `timelyllm fleet` measures is this router's placement. `_submit_to` and `_note_output`
are the two points a subclass hooks: before a run goes to a replica, and for every output a
replica produced.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from timelyllm_ros.core.engine.base import (EngineAdapter, EngineCapabilities, EngineOutput,
                                            EngineRequest, KvUsage, PauselessEngine,
                                            StepTiming)
from timelyllm_ros.core.engine.eviction import ParkedGeneration


class NoReplicaAvailable(RuntimeError):
    pass


def affinity_key(request_id: str) -> str:
    """The task a run belongs to (`<task>#<n>` -> `<task>`)."""
    return request_id.rsplit("#", 1)[0]


@dataclass
class Replica:
    """One engine of the set. `build` makes (or re-makes) it; `health` says whether it can take
    work (None: always, e.g. a simulated engine)."""

    name: str
    build: Callable[[], EngineAdapter]
    health: Callable[[EngineAdapter], bool] | None = None
    engine: EngineAdapter | None = None
    down_reason: str = ""
    down_since: float = 0.0
    placed: int = 0                 # plans placed here (tie-break, and the balance test)

    def up(self) -> bool:
        if self.engine is None:
            return False
        return self.health is None or bool(self.health(self.engine))


@dataclass
class ReplicaStats:
    placed: dict[str, int] = field(default_factory=dict)
    moved: int = 0                  # resumes sent elsewhere because their replica was down
    failed_runs: int = 0            # runs ended with an error by a dying replica


class ReplicaEngine(PauselessEngine):
    """EngineAdapter over several replicas (module docstring)."""

    name = "replicas"
    # Tasks whose replica is remembered (a task's home is dropped when its plan finishes; a
    # cancelled or failed task's is dropped oldest first beyond this).
    HOMES_KEPT = 100_000

    def __init__(self, replicas: Sequence[Replica], *, reprobe_s: float = 5.0):
        if not replicas:
            raise ValueError("engine.replicas: at least one replica is required")
        self.replicas = list(replicas)
        self.reprobe_s = reprobe_s
        self.stats = ReplicaStats()
        self._where: dict[str, Replica] = {}      # run id -> replica
        self._task_home: OrderedDict[str, Replica] = OrderedDict()  # affinity key -> replica
        self._last_timing = StepTiming()
        self._index = {id(r): i for i, r in enumerate(self.replicas)}  # replica -> its index
        for replica in self.replicas:
            self._try_build(replica)
        live = [r for r in self.replicas if r.engine is not None]
        if not live:
            reasons = "; ".join(f"{r.name}: {r.down_reason}" for r in self.replicas)
            raise NoReplicaAvailable(f"engine.replicas: no replica is reachable ({reasons})")
        self._first = live[0].engine

    def _try_build(self, replica: Replica) -> None:
        try:
            replica.engine = replica.build()
            replica.down_reason = ""
        except Exception as err:  # noqa: BLE001 - any start-up failure: down, probed later
            replica.engine = None
            replica.down_reason = f"{type(err).__name__}: {err}"
            replica.down_since = time.monotonic()

    def _reprobe(self) -> None:
        now = time.monotonic()
        for replica in self.replicas:
            if replica.engine is None and now - replica.down_since >= self.reprobe_s:
                self._try_build(replica)

    # -- routing ---------------------------------------------------------------------------
    @staticmethod
    def _capacity(replica: Replica) -> tuple[float, int, int]:
        engine = replica.engine
        kv = engine.kv_usage()
        free_kv = kv.free_blocks / max(1, kv.total_blocks)
        seqs = engine.capabilities().max_num_seqs
        free_slots = (seqs - engine.num_running()) if seqs is not None else 1 << 20
        return free_kv, free_slots, -replica.placed

    def _pick(self, exclude: Replica | None = None) -> Replica:
        self._reprobe()
        replica = self._most_free(exclude)
        if replica is None:
            reasons = "; ".join(f"{r.name}: {r.down_reason or 'unhealthy'}"
                                for r in self.replicas)
            raise NoReplicaAvailable(f"no replica can take the request ({reasons})")
        return replica

    def _most_free(self, exclude: Replica | None = None) -> Replica | None:
        live = [r for r in self.replicas if r is not exclude and r.up()]
        return max(live, key=self._capacity) if live else None

    def _route(self, request: EngineRequest) -> Replica:
        key = affinity_key(request.request_id)
        home = self._task_home.get(key)
        if home is not None and home.up():
            return home
        replica = self._pick()
        if home is not None:
            self.stats.moved += 1
        else:
            replica.placed += 1
            self.stats.placed[replica.name] = replica.placed
        self._task_home[key] = replica
        while len(self._task_home) > self.HOMES_KEPT:
            self._task_home.popitem(last=False)
        return replica

    def replica_of(self, request_id: str) -> str | None:
        replica = self._where.get(request_id) or self._task_home.get(affinity_key(request_id))
        return None if replica is None else replica.name

    def replica_for(self, request_id: str) -> int | None:
        """The replica `request_id` runs on, or the one `_route` would give it now (its task's
        home while that is up, else the most free replica); None while no replica is up. No
        side effect: nothing is placed or probed."""
        replica = self._where.get(request_id)
        if replica is None:
            replica = self._task_home.get(affinity_key(request_id))
            if replica is None or not replica.up():
                replica = self._most_free()
        return None if replica is None else self._index[id(replica)]

    # -- requests --------------------------------------------------------------------------
    def _submit_to(self, replica: Replica) -> None:
        """Called before a run is added to (or resumed on) `replica`; real servers need
        nothing."""

    def add_request(self, request: EngineRequest) -> None:
        replica = self._route(request)
        self._submit_to(replica)
        replica.engine.add_request(request)
        self._where[request.request_id] = replica

    def abort_request(self, request_id: str) -> None:
        replica = self._where.pop(request_id, None)
        if replica is not None and replica.engine is not None:
            replica.engine.abort_request(request_id)

    def forget_task(self, task_key: str) -> None:
        self._task_home.pop(task_key, None)

    def suspend_request(self, request_id: str, handling: str) -> None:
        replica = self._where.get(request_id)
        if replica is not None:
            replica.engine.suspend_request(request_id, handling)

    def resume_request(self, request_id: str, request: EngineRequest) -> None:
        replica = self._where.pop(request_id, None)
        if replica is not None and replica.up():
            self._submit_to(replica)
            replica.engine.resume_request(request_id, request)
            self._where[request.request_id] = replica
            return
        if replica is not None and replica.engine is not None:
            replica.engine.abort_request(request_id)
        self.add_request(request)  # moves it (its replica is down)

    def paused_handling(self, request_id: str) -> str | None:
        replica = self._where.get(request_id)
        return None if replica is None else replica.engine.paused_handling(request_id)

    def pinned_blocks(self) -> int:
        return sum(r.engine.pinned_blocks() for r in self.replicas if r.engine is not None)

    def evict_paused(self, request_id: str, reason: str = "scheduler") -> int:
        replica = self._where.get(request_id)
        return 0 if replica is None else replica.engine.evict_paused(request_id, reason)

    def paused_generations(self) -> list[ParkedGeneration]:
        return [p for r in self.replicas if r.engine is not None
                for p in r.engine.paused_generations()]

    def step(self) -> list[EngineOutput]:
        start = time.perf_counter()
        outputs: list[EngineOutput] = []
        batch = 0
        for replica in self.replicas:
            engine = replica.engine
            if engine is None or not engine.has_unfinished_requests():
                continue
            batch += engine.num_running()
            for out in engine.step():
                self._note_output(out)
                outputs.append(out)
        self._last_timing = StepTiming(duration_s=time.perf_counter() - start, batch_size=batch)
        return outputs

    def _note_output(self, out: EngineOutput) -> None:
        """A finished run is no longer anywhere; its task's home is dropped with its plan."""
        if out.finished:
            self._where.pop(out.request_id, None)
            self._task_home.pop(affinity_key(out.request_id), None)
            if out.finish_reason == "error":
                self.stats.failed_runs += 1

    # -- aggregate state -------------------------------------------------------------------
    def _live_engines(self) -> list[EngineAdapter]:
        return [r.engine for r in self.replicas if r.engine is not None]

    def capabilities(self) -> EngineCapabilities:
        caps = [e.capabilities() for e in self._live_engines()]
        seqs = [c.max_num_seqs for c in caps]
        return EngineCapabilities(
            pause_handling=all(c.pause_handling for c in caps),
            max_num_seqs=None if None in seqs else sum(seqs), profile=caps[0].profile,
            kv_bytes_per_token=caps[0].kv_bytes_per_token,
            host_link_bytes_per_s=caps[0].host_link_bytes_per_s)

    def kv_usage(self) -> KvUsage:
        usages = [e.kv_usage() for e in self._live_engines()]
        return KvUsage(free_blocks=sum(u.free_blocks for u in usages),
                       total_blocks=sum(u.total_blocks for u in usages),
                       block_size=usages[0].block_size)

    def has_unfinished_requests(self) -> bool:
        return any(e.has_unfinished_requests() for e in self._live_engines())

    def num_running(self) -> int:
        return sum(e.num_running() for e in self._live_engines())

    def last_step_timing(self) -> StepTiming:
        return self._last_timing

    def now(self) -> float:
        return self._first.now()

    def advance_idle(self, until: float) -> None:
        self._first.advance_idle(until)

    def tokenize(self, text: str) -> list[int]:
        return self._first.tokenize(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._first.decode(token_ids)

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return self._first.render_chat(messages)

    def max_model_len(self) -> int:
        return min(e.max_model_len() for e in self._live_engines())

    def max_num_batched_tokens(self) -> int:
        return min(e.max_num_batched_tokens() for e in self._live_engines())

    def shutdown(self) -> None:
        for engine in self._live_engines():
            engine.shutdown()

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "replicas": [r.name for r in self.replicas],
                "placed": dict(self.stats.placed), "moved": self.stats.moved}
