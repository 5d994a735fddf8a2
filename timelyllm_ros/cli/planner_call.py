"""One service call to the running planner for a command-line tool (`timelyllm cancel`,
`timelyllm update`): a short-lived client, the call, and the planner's refusal or a timeout
printed as `timelyllm COMMAND: reason` on stderr."""

from __future__ import annotations

import sys
from typing import Any, Callable


def call_planner(command: str, call: Callable[[Any], Any]) -> Any | None:
    """`call(client)` on a fresh PlannerClient; its response when `response.success`, else None
    after printing why (the caller exits 1)."""
    from timelyllm_ros.ros.client import PlannerClient

    client = PlannerClient(node_name=f"timelyllm_{command}")
    try:
        response = call(client)
    except TimeoutError as err:
        print(f"timelyllm {command}: {err}", file=sys.stderr)
        return None
    finally:
        client.close()
    if not response.success:
        print(f"timelyllm {command}: {response.reason}", file=sys.stderr)
        return None
    return response
