"""The step half of `VllmEngine` (vllm_engine.py): run vLLM one iteration and turn its outputs
into `EngineOutput`s of our runs.

Before the step, sessions that vLLM parked at a chunk end but the scheduler did not suspend get
their next chunk (the last token again: vLLM drops it on resume). After it, each output is
mapped from the session to its current run, a held token is handed out first, chunk ends are
classified (vllm_sessions.classify_chunk_end), and the first output of a run records what vLLM
scheduled for it (`RunStats`). Then, if vLLM preempted a request or left one waiting while
parked sessions hold blocks or slots, the cheapest parked sessions are evicted (eviction.py).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from timelyllm_ros.core.engine.base import EngineOutput, EngineRequest, StepTiming
from timelyllm_ros.core.engine.eviction import (EvictionStats, ParkedGeneration, eviction_order,
                                                recompute_seconds)
from timelyllm_ros.core.engine.vllm_sessions import PARKED, RUNNING, Run, classify_chunk_end


@dataclass(frozen=True)
class RunStats:
    """One run (engine request) as vLLM's scheduler accounted for it.

    prompt_tokens: its prompt (the whole context for a resume). computed_tokens: prompt tokens
    vLLM scheduled before the run's first new token (its own `num_scheduled_tokens`).
    cached_tokens: the rest (prefix cache, or the session's parked KV). appended_tokens: tokens
    new to the context (e.g. an observation). recomputed_tokens: computed - appended: for a
    resume, the previous context computed again. path: fresh (an `add_request`: a new plan, or
    a discarded generation resubmitted by the scheduler) | session (a parked session resumed) |
    resubmit (an evicted session's run, through the prefix cache).
    """

    request_id: str
    path: str
    prompt_tokens: int
    computed_tokens: int
    cached_tokens: int
    appended_tokens: int
    recomputed_tokens: int



class VllmOutputs:
    """Mixin of `VllmEngine`, which owns the state declared here."""

    config: Any
    profile: Any
    STATS_KEPT: int
    _engine: Any
    _core: Any
    _runs: dict[str, Run]
    _by_key: dict[str, Run]
    _by_internal: dict[str, Run]
    _stats: OrderedDict[str, RunStats]
    eviction_stats: EvictionStats
    pause_stats: dict[str, int]
    _last_timing: StepTiming
    _block_size: int

    def _chunk_params(self, run: Run, max_tokens: int) -> Any: ...
    def _evict(self, run: Run, reason: str) -> int: ...
    def _forget(self, run: Run) -> None: ...
    def paused_generations(self) -> list[ParkedGeneration]: ...

    def step(self) -> list[EngineOutput]:
        start = time.perf_counter()
        self._continue_parked()
        batch = sum(1 for r in self._runs.values() if r.state == RUNNING)
        raw = self._engine.step()
        accounting = self._core.drain() if self._core is not None else None
        if accounting is not None:
            for internal, n in accounting.scheduled.items():
                run = self._by_internal.get(internal)
                if run is not None and run.first_output:
                    run.scheduled += n
        outputs: dict[str, EngineOutput] = {}
        for run in list(self._runs.values()):  # held tokens go first
            if run.held is not None and run.state == RUNNING:
                outputs[run.run_id] = self._hand_out_held(run)
        for out in raw:
            completion = out.outputs[0] if out.outputs else None
            run = self._by_key.get(out.request_id)
            if completion is None or run is None or run.state not in (RUNNING, PARKED):
                continue
            self._consume(run, completion, out, outputs)
        self._relieve_pressure(accounting)
        result = list(outputs.values())
        self._last_timing = StepTiming(
            duration_s=time.perf_counter() - start, batch_size=batch,
            extra={"tokens": sum(len(o.new_token_ids) for o in result)})
        return result

    def _continue_parked(self) -> None:
        for run in self._runs.values():
            if run.state != PARKED:
                continue
            left = run.max_tokens - run.generated
            params = self._chunk_params(run, 1 if run.lookahead else left)
            self._core.send_chunk(run.key, run.internal_id, run.tokens[-1:], params)
            run.state = RUNNING
            self.pause_stats["auto_continues"] += 1

    def _hand_out_held(self, run: Run) -> EngineOutput:
        token, text = run.held, run.held_text
        run.held, run.held_text = None, ""
        run.tokens.append(token)
        run.generated += 1
        out = EngineOutput(run.run_id, [token], text)
        self._first_output(run, out)
        if run.generated >= run.max_tokens:  # the held token was the whole run
            out.finished, out.finish_reason = True, "length"
            self._end(run)
        return out

    def _consume(self, run: Run, completion: Any, raw: Any,
                 outputs: dict[str, EngineOutput]) -> None:
        ids = list(completion.token_ids)
        out = outputs.get(run.run_id)
        if out is None:
            out = outputs[run.run_id] = EngineOutput(run.run_id, [], "")
        out.new_token_ids.extend(ids)
        out.new_text += completion.text
        if ids:
            run.tokens.extend(ids)
            run.generated += len(ids)
            run.last_text = completion.text
        if run.first_output and (ids or completion.finish_reason is not None):
            self._first_output(run, out, raw_cached=raw.num_cached_tokens)
        if not run.session:
            if raw.finished:
                out.finished, out.finish_reason = True, completion.finish_reason
                self._forget(run)
            return
        end = classify_chunk_end(completion.finish_reason, completion.stop_reason,
                                 run.generated, run.max_tokens, run.lookahead)
        if end is None:
            return
        if end.finished:
            out.finished, out.finish_reason = True, end.finish_reason
            self._end(run)
        else:
            run.state = PARKED
            run.lookahead = end.lookahead

    def _end(self, run: Run) -> None:
        """A session's plan is over: free it (its blocks stay in the prefix cache)."""
        self._forget(run)
        if run.session and self._core.is_parked(run.internal_id):
            self._core.abort(run.internal_id)

    def _first_output(self, run: Run, out: EngineOutput, raw_cached: int | None = None) -> None:
        run.first_output = False
        if self._core is not None:
            computed = min(run.scheduled, run.prompt_len)
        else:  # no scheduler accounting: vLLM's own prefill stats
            computed = run.prompt_len - int(raw_cached or 0)
        cached = run.prompt_len - computed
        # (For a task's first run this is just the prompt tail vLLM computed; the engine cannot
        # tell a resubmitted generation from a new one, the scheduler can.)
        recomputed = max(0, computed - run.appended)
        stats = RunStats(run.run_id, run.path, run.prompt_len, computed, cached, run.appended,
                         recomputed)
        self._stats[run.run_id] = stats
        while len(self._stats) > self.STATS_KEPT:
            self._stats.popitem(last=False)
        if run.path == "resubmit":
            self.eviction_stats.recomputed_tokens += recomputed
        out.num_cached_tokens = cached
        out.recomputed_tokens = recomputed

    def _relieve_pressure(self, accounting: Any) -> None:
        """vLLM never preempts a parked session: if it preempted a running request or cannot
        admit a waiting one while sessions are parked, evict the cheapest parked ones."""
        if accounting is None or self._core is None:
            return
        short_blocks, short_slots = self._core.admission_shortfall()
        if accounting.preempted:
            short_blocks = max(short_blocks, 1)
        if short_blocks <= 0 and short_slots <= 0:
            return
        parked = self.paused_generations()
        if not parked:
            return
        freed_blocks = freed_slots = 0
        for p in eviction_order(parked, self._recompute_s):
            if freed_blocks >= short_blocks and freed_slots >= short_slots:
                break
            run = self._runs.get(p.key)
            if run is not None:
                self._evict(run, reason="kv" if short_blocks > 0 else "slots")
                freed_blocks += p.blocks
                freed_slots += 1

    def _recompute_s(self, tokens: int) -> float:
        return recompute_seconds(self.profile, tokens)
