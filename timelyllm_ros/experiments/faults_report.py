"""The fault runner's table (experiments/faults.py): one row per fault, printed with `rich` when
it is installed (plain text otherwise), and written as faults.json (every figure) and
faults_table.md (the table) with `--out`."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

COLUMNS = ("fault", "what happened", "every task terminal", "clients told", "robots stopped",
           "back to idle")


def _s(x) -> str:
    return "-" if x is None else f"{x:.2f} s"


def happened(r: dict) -> str:
    parts = [f"{n}x {what}" for what, n in sorted(r.get("outcomes", {}).items(),
                                                   key=lambda kv: -kv[1])]
    if "planner_exit" in r:
        code = r["planner_exit"].get("code")
        after = r["planner_exit"].get("after_s")
        parts.append(f"planner exit status {code}" + (f" after {after:.2f} s" if after else ""))
    if "recovered" in r:
        rec = r["recovered"]
        parts.append(f"active again after {_s(rec['after_s'])}" if rec["active_again"]
                     else "did not come back to active")
    if "link" in r:
        link = r["link"]
        parts.append(f"link cut {link['cut_for_s']} s; robot back {_s(link['robot_back_after_s'])} "
                     "after restore" if link["robot_back"] else "robot not back after restore")
    if "fresh_task" in r:
        f = r["fresh_task"]
        parts.append(f"a new task after it: {f['state']}" + (f" ({f['reason'][:60]})"
                                                              if f["state"] != "done" else ""))
    if "burst" in r:
        b = r["burst"]
        served = (f"; first segments p50 {b['response_p50_s']:.2f} s, p99 "
                  f"{b['response_p99_s']:.2f} s, mean utility {b['mean_utility']:.2f}, "
                  f"{b['utility_at_most_zero']} at or below 0" if b.get("served") else "")
        how = f"at {b['rate_per_s']:g}/s" if b.get("rate_per_s") else "at once"
        took = f"; the planner took {b['planner_took']}" if b.get("planner_took") is not None else ""
        parts.insert(0, f"{b['goals']} goals sent {how} to {b['robots']} robots; "
                        f"{b['answered']} answered within {b['answered_within_s']:.2f} s"
                        + took + served)
    return "; ".join(parts)


def terminal(r: dict) -> str:
    if not r.get("all_terminal"):
        tasks = r.get("tasks", {}).values()
        open_ = sum(1 for t in tasks if t["terminal_after_s"] is None)
        ended = [t["terminal_after_s"] for t in tasks if t["terminal_after_s"] is not None]
        text = f"NO: {open_} of {r.get('n_tasks', 0)} never terminal"
        if ended:
            text += f" (the other {len(ended)} within {max(ended):.2f} s" + \
                (" of the last answered goal)" if "burst" in r else ")")
        return text
    text = _s(r["terminal_after_s"])
    if "burst" in r:
        return f"{text} after the last goal"
    if r.get("affected") and len(r["affected"]) < r.get("n_tasks", 0):
        return f"affected {_s(r['affected_terminal_after_s'])}; all {text}"
    return text


def told(r: dict) -> str:
    n, total = r.get("clients_told", 0), r.get("n_tasks", 0)
    if n == 0:
        return f"0/{total}" + (f" within {r['client_wait_s']:.0f} s" if "client_wait_s" in r else "")
    return f"{n}/{total}, last {_s(r['clients_told_after_s'])}"


def stopped(r: dict) -> str:
    robots = r.get("robots") or {}
    if not robots:
        return "-"
    times = [v["stopped_after_s"] for v in robots.values() if v["stopped_after_s"] is not None]
    # "cancelled after N s (...)" -> "cancelled", "planner lost: /planner gave ..." -> "planner lost"
    hows = sorted({v["how"].split(":")[0].split(" after")[0].split(" (")[0]
                   for v in robots.values() if v["stopped_after_s"] is not None})
    text = f"{len(times)}/{len(robots)} stopped mid-segment"
    if times:
        text += f" within {max(times):.2f} s ({'; '.join(hows)})"
    noticed = [v["noticed_after_s"] for v in robots.values() if v.get("noticed_after_s") is not None]
    if any("noticed_after_s" in v for v in robots.values()):
        text += f"; {len(noticed)}/{len(robots)} noticed the planner gone"
        if noticed:
            text += f" within {max(noticed):.2f} s"
    return text


def idle(r: dict) -> str:
    report = r.get("idle")
    if not report:
        return "-"
    p = report["planner"]
    failed = [_failure(k, report) for k, ok in report["checks"].items() if not ok]
    if failed:
        return "NO: " + "; ".join(failed)
    bits = []
    if "exited" in p:
        bits.append(f"planner gone (exit {p['exited']})")
    else:
        bits.append(f"queue {p['queued']}, running {p['running']}, active {p['active_tasks']}, "
                    f"KV {p['kv_free_blocks']}/{p['kv_total_blocks']} free, robot goals "
                    f"{p['robot_goals_outstanding']}")
    gone = [label for label, code in report["exited"].items() if label != "planner"]
    if gone:
        bits.append(f"{', '.join(gone)} gone")
    grown = [f"{label} +{after - before}" for label, t in report["threads"].items()
             for before, after in [t["changed"].get("ThreadPoolExecu", (0, 0))] if after > before]
    bits.append("robots idle, threads as before" +
                (f" (executor pool workers started: {', '.join(grown)})" if grown else ""))
    return "yes: " + "; ".join(bits)


def _failure(check: str, report: dict) -> str:
    p = report["planner"]
    if check == "planner_action_clients":
        c = p["segment_clients"]
        return ("the planner's ExecuteSegment action clients per robot "
                f"{sorted(set(c['before'].values()))} before, "
                f"{sorted(set(c['after'].values()))} after")
    if check == "planner_queue_kv":
        return (f"planner queue {p.get('queued')}, running {p.get('running')}, active "
                f"{p.get('active_tasks')}, KV {p.get('kv_free_blocks')}/"
                f"{p.get('kv_total_blocks')} free")
    if check == "planner_goals":
        return f"robot goals outstanding {p.get('robot_goals_outstanding')}"
    if check.endswith("_threads"):
        label = check.removesuffix("_threads")
        t = report["threads"][label]
        return f"{label} threads {t['before']} -> {t['after']} ({t['changed']})"
    return check


def cells(r: dict) -> list[str]:
    if "error" in r:
        return [r.get("title", r.get("row", "?")), f"ERROR: {r['error']}", "-", "-", "-", "-"]
    return [r["title"], happened(r), terminal(r), told(r), stopped(r), idle(r)]


def row_line(r: dict) -> str:
    c = cells(r)
    return " | ".join(f"{name}: {value}" for name, value in zip(COLUMNS[1:], c[1:]))


def markdown(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells(r)) + " |")
    return "\n".join(lines)


def print_table(rows: list[dict], out=sys.stdout) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(markdown(rows), file=out)
        return
    table = Table(title="Faults: every task terminal, every client told, back to idle",
                  show_lines=True)
    for name in COLUMNS:
        table.add_column(name, overflow="fold")
    for r in rows:
        table.add_row(*cells(r))
    Console(file=out, width=max(160, Console(file=out).width)).print(table)


def write(rows: list[dict], out: Path, log_dir: Path, order: list[str] | None = None) -> None:
    """faults.json and faults_table.md in `out`. Rows already in its faults.json that were not
    run now are kept (each row says when and on which commit it was measured), so `--only`
    updates some rows of a table; `order` (row names) sorts them."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "faults.json"
    kept: dict[str, dict] = {}
    if path.is_file():
        try:
            kept = {r["row"]: r for r in json.loads(path.read_text()).get("rows", []) if "row" in r}
        except (ValueError, AttributeError):
            kept = {}
    kept.update({r["row"]: r for r in rows})
    rank = {name: i for i, name in enumerate(order or [])}
    rows = sorted(kept.values(), key=lambda r: rank.get(r["row"], len(rank)))
    meta = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "host": platform.node(),
            "python": platform.python_version(), "cpus": _cpus(), "logs": str(log_dir)}
    path.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    (out / "faults_table.md").write_text(markdown(rows) + "\n")


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))
