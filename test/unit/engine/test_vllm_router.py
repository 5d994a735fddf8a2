"""The planner behind vllm-router, for real on loopback: two `vllm serve` CPU workers (bundled
model, 512 MiB of KV each, 32-token blocks), `vllm-router --policy consistent_hash` in front, and
the planner's scheduler (`engine.kind: openai`, `router: true`) against the router.

- tasks complete, and every resume reaches the worker holding its plan: the prompt tokens it
  finds in the prefix cache are what the same tasks find on one server reached directly;
- the router's added latency per request (a printed figure, nothing timed is asserted);
- a worker killed mid-run: its generating run ends with the reason, its suspended plan resumes
  on the other worker, new plans avoid it while it is down and reach it again once it is back.

One deployment for the module (the workers start concurrently, about a minute on 2 cores); every
process is killed in its teardown.
"""

from __future__ import annotations

import time

import pytest

from timelyllm_ros.bench.router_workload import run_one_after_another
from timelyllm_ros.core.engine.factory import EngineSpec, build_engine

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

BLOCK = 32
SEQS = 8


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    pytest.importorskip("vllm")
    from timelyllm_ros.bench.vllm_deployment import Deployment, router_binary
    from timelyllm_ros.core.engine.model_prep import DEFAULT_MODEL_DIR

    if not (DEFAULT_MODEL_DIR / "config.json").is_file():
        pytest.skip("bundled model not prepared (run scripts/bootstrap.sh)")
    try:
        router_binary()
    except FileNotFoundError as err:
        pytest.skip(str(err))
    dep = Deployment(DEFAULT_MODEL_DIR, tmp_path_factory.mktemp("vllm-router"), workers=2,
                     kv_cache_bytes=512 << 20, max_num_seqs=SEQS,
                     worker_flags=("--block-size", str(BLOCK)))
    dep.start()
    try:
        yield dep
    finally:
        dep.stop()


def _router_engine(dep):
    return build_engine(EngineSpec.from_params({"kind": "openai", "url": dep.router.url,
                                                "router": True, "max_num_seqs": SEQS}))


def test_resumes_through_the_router_find_their_prefix_as_directly(deployment):
    engine = _router_engine(deployment)
    try:
        # The KV the scheduler admits against is both workers', summed.
        kv = engine.kv_usage()
        figures = engine.worker_figures()
        assert len(figures) == 2 and all(f["up"] for f in figures)
        assert kv.total_blocks == sum(f["total_blocks"] for f in figures) > 0
        assert kv.block_size == BLOCK and engine.capabilities().max_num_seqs == 2 * SEQS
        sch, via_router = run_one_after_another(engine, deployment.worker_urls(), "rt", 4)
    finally:
        engine.shutdown()
    assert {t: sch.tasks[t].state for t in sch.tasks} == {f"rt-{i}": "done" for i in range(4)}
    direct = build_engine(EngineSpec.from_params({"kind": "openai",
                                                  "url": deployment.worker_urls()[0]}))
    try:
        sch, via_direct = run_one_after_another(direct, deployment.worker_urls()[:1], "dt", 4)
    finally:
        direct.shutdown()
    assert all(t.state == "done" for t in sch.tasks.values())

    # Every run of a task went to one worker (the session key), and each resume found its
    # whole plan so far in that worker's prefix cache, as on one server reached directly.
    workers = {}
    for run in via_router:
        workers.setdefault(run.task_id, set()).add(run.worker)
    assert all(len(w) == 1 and None not in w for w in workers.values()), workers

    def shortfalls(runs, prefix):
        return {(r.task_id.replace(prefix, ""), r.resume): r.full_blocks(BLOCK) - r.cached
                for r in runs if r.resume >= 1}

    router_miss, direct_miss = shortfalls(via_router, "rt"), shortfalls(via_direct, "dt")
    common = sorted(set(router_miss) & set(direct_miss))
    print(f"\nworkers per task (router): { {t: sorted(w) for t, w in workers.items()} }")
    print("resume (task, n): cached prompt tokens via router / direct, of whole blocks")
    for key in common:
        r = next(x for x in via_router if (x.task_id.replace("rt", ""), x.resume) == key)
        d = next(x for x in via_direct if (x.task_id.replace("dt", ""), x.resume) == key)
        print(f"  {key}: {r.cached}/{r.full_blocks(BLOCK)} via router, "
              f"{d.cached}/{d.full_blocks(BLOCK)} direct")
    assert len(common) >= 8
    assert [router_miss[k] for k in common] == [direct_miss[k] for k in common]


def test_the_router_adds_little_latency(deployment):
    from timelyllm_ros.bench.router_probe import router_overhead

    summary = router_overhead(deployment.router.url, deployment.worker_urls(),
                              requests=20).summary()
    print("\nrouter vs the same worker directly, 20 interleaved pairs, 8 output tokens:")
    for key, value in summary.items():
        print(f"  {key}: {value:.1f}" if isinstance(value, float) else f"  {key}: {value}")
    assert summary["requests"] == 20


def test_a_worker_killed_mid_run(deployment):
    from timelyllm_ros.bench.router_probe import worker_of_session
    from timelyllm_ros.bench.router_workload import (MeteredRuns, Robots, drone_tasks,
                                                     lrtrace_tasks, make_scheduler, run_tasks)
    from timelyllm_ros.bench.vllm_deployment import prefix_counters

    urls = deployment.worker_urls()
    # Task ids whose session reaches each worker (consistent hashing over the two).
    home = {}
    for i in range(80):
        home.setdefault(worker_of_session(deployment.router.url, urls, f"kill-{i}"), []).append(i)
        if len(home.get(1, ())) >= 5:
            break
    victim_ids = home[1][:5]
    engine = _router_engine(deployment)
    meter = MeteredRuns(engine, urls, per_run_counters=False)
    sch = make_scheduler(engine)
    robots = Robots(exec_s=3.0)
    # On the victim: two drone plans, one of which should be between runs (suspended, its plan
    # not complete) when it dies, and a chat plan generating (chat runs are up to 60 tokens,
    # drone ones 10: long enough to be caught mid-run).
    count = max(victim_ids) + 1
    drone = drone_tasks("kill", count, engine.now())
    chat = lrtrace_tasks("kill", count, engine.now(), ("chat",))
    plans = [drone[victim_ids[0]], drone[victim_ids[1]], chat[victim_ids[2]]]
    later, back = drone[victim_ids[3]], drone[victim_ids[4]]
    generating = plans[2].task_id
    state = {}
    try:
        for spec in plans:
            sch.submit(spec)

        def caught(_):
            mid_plan = [t.task_id for t in (sch.tasks[p.task_id] for p in plans[:2])
                        if not t.generation_finished and t.state == "suspended"]
            if mid_plan and meter.generating(generating):
                state["suspended"] = mid_plan[0]
            return "suspended" in state
        run_tasks(sch, robots, 120, until=caught)
        assert "suspended" in state, "no moment with a plan suspended and one generating"
        suspended = state["suspended"]
        deployment.servers[1].kill()
        survivor_before = prefix_counters(urls[0])
        run_tasks(sch, robots, 300)
        errors = [r for r in meter.runs.values() if r.error]
        print(f"\nruns ended with an error: {[(r.request_id, r.error) for r in errors]}")
        failed = sch.tasks[generating]
        assert failed.state == "failed", failed.lifecycle.history
        assert "broke off" in failed.lifecycle.reason, failed.lifecycle.reason
        # Every run streaming from it when it died ended with the reason, and its task failed
        # with it (the other drone plan may have been generating too).
        assert generating in {r.task_id for r in errors}
        for run in errors:
            assert "broke off" in run.error and sch.tasks[run.task_id].state == "failed"
        assert sch.tasks[suspended].state == "done", sch.tasks[suspended].lifecycle.history
        assert prefix_counters(urls[0])[0] > survivor_before[0]  # it resumed on the survivor
        assert not engine.has_unfinished_requests() and engine.healthy()
        deployment.wait_router_sees({0}, time.monotonic() + 30)
        # A new plan whose session belongs to the victim is served while it is down.
        sch.submit(later)
        run_tasks(sch, robots, 300)
        assert sch.tasks[later.task_id].state == "done", sch.tasks[later.task_id].lifecycle.history
        assert engine.kv_usage().free_blocks <= engine.kv_usage().total_blocks // 2
        # Back: the router's health check takes it in again and its sessions go to it.
        restart_at = time.monotonic()
        deployment.restart(1)
        rejoin_at = time.monotonic()
        rejoined_s = deployment.wait_router_sees({0, 1}, time.monotonic() + 60)
        before = prefix_counters(urls[1])
        sch.submit(back)
        run_tasks(sch, robots, 300)
        assert sch.tasks[back.task_id].state == "done", sch.tasks[back.task_id].lifecycle.history
        assert prefix_counters(urls[1])[0] > before[0]  # its sessions reach it again
        print(f"\nthe chat run on worker1 ended with: {errors[0].error}")
        print(f"worker1 restarted: answering {rejoin_at - restart_at:.1f} s after the restart, "
              f"healthy in the router {rejoined_s:.1f} s later (--health-check-interval-secs 1)")
    finally:
        engine.shutdown()
        if not deployment.servers[1].alive():
            deployment.restart(1)
