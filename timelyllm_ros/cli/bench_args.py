"""The command line of `timelyllm bench`: its options, their defaults and their value types.

Separate from `cli/bench.py` (which checks the options against each other, builds the bench's
configuration and runs the replay or one of its modes) because the parser is read on its own:
the tests parse flags without running anything, and `cli/pred_sensitivity.py` reuses the
`--load-scale` type.
"""

from __future__ import annotations

import argparse

from timelyllm_ros.bench.config import (DEFAULT_GEN_TIME_S, DEFAULT_RESUME_LEAD_S,
                                        DEFAULT_SEGMENTED_BATCH_CAP, PAPER_PROMPT_TOKENS,
                                        ROBOT_MODES)
from timelyllm_ros.bench.policies import DEFAULT_ALIAS

DEFAULT_POLICIES = "vllm,vllm-stream,fcfs-seg,edf-seg,timelyllm"


def _optional_number(kind):
    def parse(text: str):
        if text.lower() in ("none", "off", ""):
            return None
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__} or 'none', got {text!r}")
        return value
    return parse


def _caps(text: str) -> list[int]:
    try:
        caps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not caps or any(c < 1 for c in caps):
        raise argparse.ArgumentTypeError(f"batch caps must be integers >= 1, got {text!r}")
    return caps


def comma_separated_scales(text: str) -> list[float]:
    """`0.25,0.5,1`: distinct numbers > 0 (load scales, chat rates)."""
    try:
        scales = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}")
    if not scales or any(not (s > 0 and s < float("inf")) for s in scales):
        raise argparse.ArgumentTypeError(f"load scales must be numbers > 0, got {text!r}")
    if len(set(scales)) != len(scales):
        raise argparse.ArgumentTypeError(f"a load scale is listed twice: {text!r}")
    return scales


# What `--prompt-tokens none` parses to: the skill sets' own prompts, not padded.
UNPADDED = "none"


def _prompt_tokens(text: str) -> int | str:
    if text.lower() in ("none", "off"):
        return UNPADDED
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'none', got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1 or 'none', got {text!r}")
    return value


def _on_off(text: str) -> bool:
    if text.lower() in ("on", "true", "yes", "1"):
        return True
    if text.lower() in ("off", "false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="timelyllm bench",
        description="Replay an LRTrace workload under several scheduling policies (same events, "
                    "same robot timings) and report time utility, response and waiting time.")
    p.add_argument("--workload", default=None,
                   help="(required, except with --chat-experiment) preset name (WID1, WID2, WID3), a seed paper's workload (seed001-chat, "
                        "seed002-rtbe, seed003-gsm8k, seed004-api; simulated engine only) or a "
                        "workload / event-list YAML file")
    p.add_argument("--policies", default=DEFAULT_POLICIES,
                   help=f"comma-separated policy names (default: {DEFAULT_POLICIES}); "
                        f"'{DEFAULT_ALIAS}' names the planner's default policy")
    p.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                   help="sim: calibrated simulated engine in virtual time (default); "
                        "vllm: the real engine in wall-clock time (needs --model)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of event composition and robot execution times "
                        "(default: the workload's)")
    p.add_argument("--batch-cap", type=int, default=None,
                   help="fixed cap on running generations for every policy")
    p.add_argument("--seg-batch-cap", type=_optional_number(int),
                   default=DEFAULT_SEGMENTED_BATCH_CAP,
                   help="without --batch-cap: cap for segmented policies (fcfs-seg, edf-seg, "
                        "timelyllm*); 'none' = each policy's own admission, latency-guided for "
                        "timelyllm* (default: none)")
    p.add_argument("--sweep-batch-cap", type=_caps, default=None, metavar="1,2,4,8,16",
                   help="also run every policy at each of these batch caps (Fig. 8)")
    p.add_argument("--chat-experiment", action="store_true",
                   help="the paper's chat experiment (Fig. 10): story requests served with "
                        "sentence and paragraph segmentation against vllm-stream and "
                        "vllm-priority (bench/chat_experiment.py); --duration-s, --seed, "
                        "--plots and --json apply")
    p.add_argument("--chat-rates", type=comma_separated_scales, default=None,
                   metavar="0.25,0.5,1,2",
                   help="story requests per second of --chat-experiment (default 0.25,0.5,1,2)")
    p.add_argument("--load-scale", type=comma_separated_scales, default=None,
                   metavar="0.25,0.5,1,2,4",
                   help="also run every policy at each multiple of the workload's event rate "
                        "(composed again with the same seed), with the upper bound; adds "
                        "'load_sweep' to the JSON and load_sweep.png to --plots")
    p.add_argument("--bound", action="store_true",
                   help="add the upper bound (each task's first segment served alone on a warm "
                        "engine) as a row, and each policy's utility as a fraction of it")
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE",
                   help="write the metrics as JSON")
    p.add_argument("--plots", default=None, metavar="DIR", help="write figures (PNG) here")
    p.add_argument("--profile", default=None,
                   help="engine profile YAML for the simulated engine "
                        "(default: config/engine_profiles/llama3-8b-rtx4090.yaml); with "
                        "--engine vllm, the real engine's measured cost model, which the "
                        "default policy's prefill hold needs (none by default)")
    p.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                   help="simulated engine: KV cache of N blocks instead of the profile's (how "
                        "much a policy's KV handling matters depends on the KV pressure)")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="simulated engine: N engines in parallel behind the replica router's "
                        "placement, each with the profile's KV (docs/fleet-scale.md)")
    p.add_argument("--model", default=None, help="local model directory (--engine vllm)")
    p.add_argument("--duration-s", type=float, default=None,
                   help="replay only the first S seconds of the workload")
    p.add_argument("--requests", type=int, default=None, metavar="N",
                   help="a seed paper's workload with a fixed request count (seed003-gsm8k, "
                        "seed004-api): only its first N requests")
    p.add_argument("--resume-lead-s", type=_optional_number(float), default=DEFAULT_RESUME_LEAD_S,
                   help="resume a suspended generation no earlier than this long before its "
                        "robot is expected to finish ('none' = as soon as admitted; default)")
    p.add_argument("--no-evict", action="store_true",
                   help="the scheduler never evicts parked (preserved) generations for an urgent "
                        "admission (default: it does; core/sched/parked.py)")
    p.add_argument("--gen-time-s", type=_optional_number(float), default=DEFAULT_GEN_TIME_S,
                   help="TimelyLLM's per-segment generation time g (default: the policy's, 0.09)")
    p.add_argument("--robots", choices=ROBOT_MODES, default="queue",
                   help="queue: a busy robot queues a new task behind its current one (default); "
                        "parallel: every task gets its own robot")
    p.add_argument("--paper-config", action="store_true",
                   help="the paper's 2024 configuration: --prompt-tokens "
                        f"{PAPER_PROMPT_TOKENS} --baseline-prefix-cache off (either flag, given "
                        "too, wins); docs/bench.md keeps its numbers as the reproduction")
    p.add_argument("--baseline-prefix-cache", type=_on_off, default=None,
                   metavar="on|off",
                   help="on (default): vllm / vllm-stream / vllm-priority run with automatic "
                        "prefix caching, as vLLM V1 does by default; off (--paper-config): "
                        "without, as vLLM V0 did by default in 2024. Segmented policies always "
                        "keep it. Both engines.")
    p.add_argument("--prompt-tokens", type=_prompt_tokens, default=None,
                   metavar="N|none",
                   help="simulated engine: pad each skill set's prompt with a fixed (shared, "
                        "cacheable) preamble to N tokens; none (default) = the skill sets' own "
                        f"prompts (--paper-config: the paper's {PAPER_PROMPT_TOKENS})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--fidelity", default=None, metavar="WORKLOAD",
                   help="the simulator against the real engine: replay WORKLOAD per policy "
                        "(default vllm-stream,default) on the real vLLM engine "
                        "(--fidelity-runs times) and once on the simulated engine with the "
                        "real engine's measured profile (--profile, default the CPU fp32 one); "
                        "per-task pairs, p50/p90/utility errors, rankings (bench/fidelity.py)")
    p.add_argument("--fidelity-runs", type=int, default=2, metavar="N",
                   help="--fidelity: real runs per policy (default 2)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="--fidelity: write fidelity.json, pairs.csv and fidelity.png here")
    p.add_argument("--family", type=int, default=None, metavar="N",
                   help="the workload family: N workloads drawn from a fixed distribution "
                        "(bench/family.py, docs/family.md), each replayed under "
                        "--family-subject, vllm-stream and vllm-priority with the bound; "
                        "--duration-s shortens every member, --json and --plots apply")
    p.add_argument("--family-seed", type=int, default=1, metavar="S",
                   help="--family: the family's seed (default 1)")
    p.add_argument("--family-subject", default=DEFAULT_ALIAS, metavar="POLICY",
                   help=f"--family: the policy judged (default {DEFAULT_ALIAS!r})")
    p.add_argument("--family-member", type=int, default=None, metavar="K",
                   help="replay member K of family --family-seed alone, and print its "
                        "workload YAML")
    p.add_argument("--overhead", action="store_true",
                   help="real engine: plan generation time segmented (robot time zero) vs "
                        "nonstop, per skill set (the paper's Table 4; bench/overhead.py)")
    p.add_argument("--overhead-repeats", type=int, default=3, metavar="N",
                   help="--overhead: rounds per skill set (default 3)")
    p.add_argument("--overhead-tasks", type=int, default=3, metavar="N",
                   help="--overhead: tasks per skill set (default 3)")
    p.add_argument("--overhead-skill-sets", default=None, metavar="drone,arm,chat",
                   help="--overhead: only these skill sets (default: every one with traces)")
    return p
