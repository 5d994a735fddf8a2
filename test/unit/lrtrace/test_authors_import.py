"""`timelyllm lrtrace import-authors`: the TimelyLLM authors' data becomes a measured workload
that keeps every job's arrival, robot, instruction, TUF and measured skill times exactly.

The source files are in ../shared/data/timelyllm-authors/ (CC BY 4.0, the TimelyLLM authors);
tests that need them are skipped where that folder is absent. The rest use a small dataset of
the same shape written here.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from timelyllm_ros.cli import lrtrace as cli
from timelyllm_ros.lrtrace.authors import default_plans_path, import_authors
from timelyllm_ros.lrtrace.authors_skills import SKILL_MAPS, AuthorsImportError
from timelyllm_ros.lrtrace.measured import (default_skill_sets, load_measured, plan_calls,
                                            tuf_from_triple)

REPO = Path(__file__).resolve().parents[3]
AUTHORS_DATA = REPO.parent / "shared" / "data" / "timelyllm-authors"
SHIPPED = {"drone-high": "data_sample_1", "drone-low": "data_sample_2",
           "arm": "data_sample_robotarm_fltrnn"}


def _source(stem: str) -> tuple[Path, Path]:
    data = AUTHORS_DATA / f"{stem}.json"
    if not data.is_file():
        pytest.skip(f"the authors' data is not here ({data})")
    return data, AUTHORS_DATA / f"{stem}_config.json"


def small_dataset(tmp_path: Path, jobs=None, config=None) -> tuple[Path, Path]:
    """Two events of the authors' shape: a drone sweep-and-goto, a delayed escape (urgent), and a
    second event 1 ms later for agent 1."""
    if jobs is None:
        jobs = [
            {"job_id": 0, "trigger time": 10.25, "agent_id": 0, "trace_id": 0,
             "task_input": "Scene: [] Task: [A] Find the cat.",
             "exe_time_detail": [["s(", 3.25], ["g(", 2.5]], "task_exe_time": 5.75,
             "tuf": [1, 1, 1.5]},
            {"job_id": 1, "trigger time": 10.251, "agent_id": 2, "trace_id": 1,
             "task_input": "Scene: [boy x:0.5] Task: [E] Get away.",
             "exe_time_detail": [["d", 3], ["mf", 1.9777], ["iv", 0.001]],
             "task_exe_time": 4.9787, "tuf": [2, 0.2, 0.5]},
            {"job_id": 2, "trigger time": 20.5, "agent_id": 1, "trace_id": 0,
             "task_input": "Scene: [] Task: [A] Find the cat.",
             "exe_time_detail": [["s(", 1.5], ["g(", 2.75]], "task_exe_time": 4.25,
             "tuf": [1, 1, 1.5]},
        ]
    if config is None:
        config = {"num_agents": 3, "max_num_per_event": 2, "lambda_rate": 0.25,
                  "job_interval": 0.001, "tarce_file": "x", "workload_file": "y",
                  "data_sample_structure": [[0, 1], [0]], "task_arrivals": [10.25, 20.5]}
    data, cfg = tmp_path / "sample.json", tmp_path / "sample_config.json"
    data.write_text(json.dumps(jobs), encoding="utf-8")
    cfg.write_text(json.dumps(config), encoding="utf-8")
    return data, cfg


def assert_jobs_kept(source_jobs: list[dict], workload_path: Path) -> None:
    """Job by job: arrival, robot, instruction (scene included), TUF and measured skill times
    exactly as the source has them, and a plan whose calls are the job's skills, mapped."""
    measured = load_measured(workload_path)
    skill_sets = default_skill_sets()
    levels = measured.tuf_levels()
    by_id = {j.job: j for j in measured.jobs}
    assert sorted(by_id) == sorted(j["job_id"] for j in source_jobs)
    width = max(2, len(str(measured.workload.agents - 1)))
    for src in source_jobs:
        job = by_id[src["job_id"]]
        trace = measured.traces[job.trace]
        kind = "arm" if src.get("robot_type") == "robotarm" else "drone"
        assert job.time_s == src["trigger time"]
        assert job.robot == f"{kind}_{src['agent_id']:0{width}d}"
        assert trace.instruction == src["task_input"]
        assert trace.skill_set == kind and trace.category == kind
        assert list(measured.tuf_triples[job.tuf]) == src["tuf"]
        tuf = levels.get(job.tuf)
        u0, ert, cutoff = src["tuf"]
        assert (tuf.initial_utility, tuf.ert_s) == (u0, ert)
        assert tuf.cutoff_s == pytest.approx(cutoff, abs=1e-12)
        theirs = [s for s, _ in src["exe_time_detail"]]
        assert list(job.times) == [t for _, t in src["exe_time_detail"]]
        assert measured.trace_skills[job.trace]["skills"] == theirs
        calls = [c.name for c in plan_calls(skill_sets[kind], trace.plan)]
        assert calls == [SKILL_MAPS[kind][s].name for s in theirs]


@pytest.mark.parametrize("stem", sorted(SHIPPED.values()))
def test_import_keeps_every_job_of_the_authors_data(tmp_path, stem):
    data, config = _source(stem)
    result = import_authors(data, config, tmp_path, name="w", plans_path=default_plans_path())
    source = json.loads(data.read_text(encoding="utf-8"))
    assert result.jobs == len(source)
    assert_jobs_kept(source, result.workload_path)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_workloads_are_a_fresh_import(tmp_path, name):
    data, config = _source(SHIPPED[name])
    result = import_authors(data, config, tmp_path, name=name, plans_path=default_plans_path())

    def body(path: Path) -> list[str]:  # the header names the command that wrote it
        return [line for line in path.read_text(encoding="utf-8").splitlines()
                if not line.startswith("#")]

    shipped = REPO / "lrtrace" / "authors"
    assert body(shipped / f"{name}.yaml") == body(result.workload_path)
    assert body(shipped / f"{name}.traces.yaml") == body(result.traces_path)
    header = (shipped / f"{name}.yaml").read_text(encoding="utf-8")
    assert "CC BY 4.0" in header and "github.com/MarkoMile/TimelyLLM" in header


def test_small_import_keeps_jobs_and_writes_a_timing_table(tmp_path):
    data, config = small_dataset(tmp_path)
    result = import_authors(data, config, tmp_path / "out", plans_path=None)
    assert_jobs_kept(json.loads(data.read_text()), result.workload_path)
    # Built plans (no plans file): one statement per skill, the delay as long as measured.
    plans = {t["id"]: t["plan"] for t in result.traces}
    assert "d,3000;" in plans[2]
    rows = result.timings_path.read_text().splitlines()
    assert len(rows) == 1 + 2 + 3 + 2  # header and one row per measured skill
    assert rows[1].startswith("sweeping,target,drone_00,job00000,0,0.0,3.25,3.25,true,1,")


def test_jobs_of_one_trace_with_other_instructions_get_their_own_trace(tmp_path):
    jobs = json.loads(small_dataset(tmp_path)[0].read_text())
    jobs[2]["task_input"] = "Scene: [cat x:0.2] Task: [A] Find the cat."
    data, config = small_dataset(tmp_path, jobs=jobs)
    result = import_authors(data, config, tmp_path / "out", plans_path=None)
    assert len(result.traces) == 3
    assert_jobs_kept(jobs, result.workload_path)


def test_unmapped_skills_are_all_named(tmp_path):
    jobs = json.loads(small_dataset(tmp_path)[0].read_text())
    jobs[0]["exe_time_detail"].append(["rp", 0.001])
    jobs[2]["exe_time_detail"].insert(0, ["od", 0.001])
    jobs[0]["task_exe_time"] += 0.001
    jobs[2]["task_exe_time"] += 0.001
    data, config = small_dataset(tmp_path, jobs=jobs)
    with pytest.raises(AuthorsImportError) as err:
        import_authors(data, config, tmp_path / "out", plans_path=None)
    text = str(err.value)
    assert "2 skill(s) with no equivalent" in text and "sample.json" in text
    assert "'rp' (re_plan" in text and "first job 0 exe_time_detail[2]" in text
    assert "'od' (object_dis" in text and "first job 2 exe_time_detail[0]" in text
    assert not (tmp_path / "out").exists()


def _mutate(jobs, config, what):
    if what == "tuf":
        del jobs[1]["tuf"]
    elif what == "exe":
        jobs[1]["exe_time_detail"][1] = ["mf", -1]
    elif what == "agent":
        jobs[2]["agent_id"] = 3
    elif what == "trace":
        jobs[2]["trace_id"] = 1
    elif what == "time":
        jobs[1]["trigger time"] = 10.26
    elif what == "total":
        jobs[0]["task_exe_time"] = 9.0
    elif what == "robot_type":
        jobs[0]["robot_type"] = "robotdog"
    elif what == "config":
        config["task_arrivals"] = [10.25]


@pytest.mark.parametrize("what,where,needle", [
    ("tuf", "sample.json: job 1", "tuf: missing"),
    ("exe", "sample.json: job 1", "exe_time_detail[1]: must be [skill, seconds >= 0]"),
    ("agent", "sample.json: job 2", "agent_id: must be an integer in [0, 3)"),
    ("trace", "sample.json: job 2", "trace_id: 1, but sample_config.json lists trace 0 at event 1"),
    ("time", "sample.json: job 1", "trigger time: 10.26, but sample_config.json has event 0"),
    ("total", "sample.json: job 0", "task_exe_time: 9.0 is not the sum"),
    ("robot_type", "sample.json: job 0", "robot_type: 'robotdog' is not one we import"),
    ("config", "sample_config.json", "task_arrivals: 1 arrivals for 2 events"),
])
def test_errors_name_the_file_the_job_and_the_field(tmp_path, what, where, needle):
    jobs = json.loads(small_dataset(tmp_path)[0].read_text())
    config = json.loads((tmp_path / "sample_config.json").read_text())
    _mutate(jobs, config, what)
    data, cfg = small_dataset(tmp_path, jobs=jobs, config=config)
    with pytest.raises(AuthorsImportError) as err:
        import_authors(data, cfg, tmp_path / "out", plans_path=None)
    assert where in str(err.value) and needle in str(err.value), str(err.value)


def test_a_plan_whose_calls_are_not_the_measured_skills_is_refused(tmp_path):
    data, config = small_dataset(tmp_path)
    plans = tmp_path / "plans.yaml"
    plans.write_text("plans:\n- instruction: 'Scene: [] Task: [A] Find the cat.'\n"
                     "  plan: '_1=s,cat;?_1==True{o,cat;a};'\n", encoding="utf-8")
    with pytest.raises(AuthorsImportError) as err:
        import_authors(data, config, tmp_path / "out", plans_path=plans)
    text = str(err.value)
    assert "plans.yaml: plan for 'Scene: [] Task: [A] Find the cat.'" in text
    assert "sweeping, orienting, approach" in text and "maps to sweeping, approach" in text


def test_measured_times_must_match_the_plans_calls(tmp_path):
    data, config = small_dataset(tmp_path)
    result = import_authors(data, config, tmp_path / "out", plans_path=None)
    text = result.workload_path.read_text()
    result.workload_path.write_text(re.sub(r"times: \[3\.25, 2\.5\]", "times: [3.25]", text))
    with pytest.raises(ValueError) as err:
        load_measured(result.workload_path)
    assert "job 0: times: 1 measured times, but the plan of trace 1 has 2 skill calls" \
        in str(err.value)


def test_tuf_triples_convert_exactly():
    tuf = tuf_from_triple([2, 0.2, 0.5])
    assert tuf.initial_utility == 2 and tuf.ert_s == 0.2
    assert tuf.utility(0.2) == 2 and abs(tuf.utility(0.5)) < 1e-12


def test_cli_import_authors_and_its_refusal_to_overwrite(tmp_path, capsys):
    data, config = small_dataset(tmp_path)
    argv = ["import-authors", str(data), "--config", str(config), "--output",
            str(tmp_path / "out"), "--name", "small", "--plans", "none"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "small: 3 jobs (2 events of the source), 2 traces" in out
    assert "drone  s(       -> sweeping" in out
    for suffix in (".yaml", ".traces.yaml", ".timings.csv"):
        assert (tmp_path / "out" / f"small{suffix}").is_file()
    header = (tmp_path / "out" / "small.yaml").read_text().splitlines()[1]
    assert "timelyllm lrtrace import-authors" in header and "--plans none" in header
    assert cli.main(argv) == 1
    assert "small.yaml: already exists (pass --force" in capsys.readouterr().err
    assert cli.main([*argv, "--force"]) == 0


def test_cli_reports_bad_json_with_its_line(tmp_path, capsys):
    data, config = small_dataset(tmp_path)
    data.write_text('[{"job_id": 0,\n  "trigger time": }]')
    assert cli.main(["import-authors", str(data), "--config", str(config), "-o",
                     str(tmp_path / "o")]) == 1
    assert "sample.json: line 2 column 19: invalid JSON" in capsys.readouterr().err


def test_every_mapped_skill_is_one_of_ours():
    sets = default_skill_sets()
    for kind, table in SKILL_MAPS.items():
        for theirs, ours in table.items():
            plan = ours.statement.replace("{var}", "_1").replace("{ms}", "5")
            assert [c.name for c in plan_calls(sets[kind], plan)] == [ours.name], theirs


def test_source_jobs_are_not_changed_by_the_import(tmp_path):
    data, config = small_dataset(tmp_path)
    before = copy.deepcopy(json.loads(data.read_text()))
    import_authors(data, config, tmp_path / "out", plans_path=None)
    assert json.loads(data.read_text()) == before
