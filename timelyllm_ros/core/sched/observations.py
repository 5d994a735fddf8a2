"""Robot results flow into the resumed plan (skill-set option `observations`, on for the drone).

A segment that stores skill results (MiniSpec `_1=iv,cup;`) decides what the plan should do
next, so with the option on the generation stops right after dispatching it, whatever the
policy's suspension rule, and waits out of the queue (its KV parked as the policy's pause
handling says) for the robot's report. The report's values then go into the context, after the
generated tokens, as one line the skill set's prompt explains:

    # ok _1=False _2=0.42

and the generation is queued to resume. Only successful reports are appended (a failure ends
the task), and only for segments that stored something: a bare `# ok` would cost a prefill and
tell the model nothing. The cost is that prefill (`observation_tokens_total` per task) and the
wait: the next segment is generated after the robot finished this one, not while it runs.
"""

from __future__ import annotations

from typing import Any, Mapping

from timelyllm_ros.core.skills.values import format_value


def observation_text(values: Mapping[str, Any]) -> str:
    """The appended line for a segment's reported values (MiniSpec literals)."""
    parts = [f"{name}={format_value(value)}" for name, value in values.items()
             if name.startswith("_")]
    return "\n# ok" + "".join(f" {p}" for p in parts) + "\n"
