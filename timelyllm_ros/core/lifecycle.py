"""Lifecycle of a task and its generation, as a `transitions` state machine.

    received --accept--> queued --admit--> generating --finish_generation--> awaiting_robot
        |                 |  ^               |     ^                                  |
      reject              |  +-- preempt ----+     |                              complete
        v                 |                  |     |                                  v
    rejected <--shed------+               suspend  admit                            done
                          |                  v     |
                          +---(admit)---- suspended

`suspend`: the generation stopped at a segment boundary and waits for its robot. `preempt`: it
was stopped mid-segment to give its KV to more urgent work (recompute: it is queued again and
continues from its token ids). `fail` and `cancel` lead from any non-terminal state to `failed` /
`cancelled`; `end_early` (the robot's plan returned) from any state after acceptance to `done`;
`shed` (overload) from `queued` to `rejected`.

Simulations create thousands of these, and building a `transitions.Machine` (or even
`add_model`, which binds trigger methods and keeps a reference to every model) per task costs
far more than the task is worth. So one Machine is built at import time with no models, and each
TaskLifecycle fires that machine's Event objects on itself: transitions reads and writes the
`state` attribute of whatever model it is handed, so the machine keeps no per-task data and a
finished task is garbage like any other object.
"""

from __future__ import annotations

from typing import Hashable

from transitions import Machine, MachineError

STATES = ("received", "queued", "generating", "suspended", "awaiting_robot",
          "done", "failed", "rejected", "cancelled")
TERMINAL_STATES = frozenset({"done", "failed", "rejected", "cancelled"})
_NON_TERMINAL = [s for s in STATES if s not in TERMINAL_STATES]

TRANSITIONS = [
    {"trigger": "accept", "source": "received", "dest": "queued"},
    {"trigger": "reject", "source": "received", "dest": "rejected"},
    # Overload: a queued task whose utility can no longer be positive is refused (Policy.hopeless).
    {"trigger": "shed", "source": "queued", "dest": "rejected"},
    {"trigger": "admit", "source": ["queued", "suspended"], "dest": "generating"},
    {"trigger": "suspend", "source": "generating", "dest": "suspended"},
    {"trigger": "preempt", "source": "generating", "dest": "queued"},
    {"trigger": "finish_generation", "source": "generating", "dest": "awaiting_robot"},
    {"trigger": "complete", "source": "awaiting_robot", "dest": "done"},
    {"trigger": "fail", "source": _NON_TERMINAL, "dest": "failed"},
    {"trigger": "cancel", "source": _NON_TERMINAL, "dest": "cancelled"},
    # The robot ended the plan with a return (MiniSpec `->`): done, whatever was left to generate.
    {"trigger": "end_early", "source": ["queued", "generating", "suspended", "awaiting_robot"],
     "dest": "done"},
]
TRIGGERS = tuple(dict.fromkeys(t["trigger"] for t in TRANSITIONS))

_MACHINE = Machine(model=[], states=list(STATES), transitions=TRANSITIONS, initial="received",
                   auto_transitions=False, ignore_invalid_triggers=False)
_EVENTS = {name: _MACHINE.events[name] for name in TRIGGERS}


def _destinations() -> dict[str, dict[str, str]]:
    """trigger -> {source state: destination}, read from the machine's events.

    The machine registers no callbacks, conditions or state hooks, so what a transition does is
    set the model's state: firing it is a look-up here. (`Event.trigger` does the same through
    its generic callback machinery at ~60 us a call, and a replay in overload fires ~70,000.)
    Checked here, so a callback added to the machine one day cannot be skipped silently."""
    hooks = [_MACHINE.before_state_change, _MACHINE.after_state_change, _MACHINE.prepare_event,
             _MACHINE.finalize_event, _MACHINE.on_exception, _MACHINE.on_final]
    hooks += [h for s in _MACHINE.states.values() for h in (s.on_enter, s.on_exit)]
    table: dict[str, dict[str, str]] = {}
    for name, event in _EVENTS.items():
        table[name] = {}
        for source, options in event.transitions.items():
            (transition,) = options  # one transition per trigger and source
            hooks += [transition.prepare, transition.conditions, transition.before,
                      transition.after]
            table[name][source] = transition.dest
    if any(hooks):
        raise RuntimeError("lifecycle: the machine has callbacks; fire its events instead of "
                           "looking destinations up")
    return table


_DESTINATIONS = _destinations()


class IllegalTransition(MachineError):
    """A trigger fired in a state that does not allow it."""

    def __init__(self, state: str, trigger: str, task_id: Hashable = None):
        who = f"task {task_id!r}: " if task_id is not None else ""
        super().__init__(f"{who}cannot {trigger!r} from state {state!r}")
        self.state = state
        self.trigger = trigger
        self.task_id = task_id


class TaskLifecycle:
    """State of one task. Every trigger takes the time of the event (the caller's clock, which
    may be virtual) and, for terminal transitions, an optional reason."""

    __slots__ = ("state", "reason", "history", "task_id")

    def __init__(self, now: float = 0.0, task_id: Hashable = None):
        self.state = "received"
        self.reason: str | None = None
        self.history: list[tuple[str, float]] = [("received", now)]
        self.task_id = task_id

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def may(self, trigger: str) -> bool:
        """Whether `trigger` is legal in the current state."""
        event = _EVENTS.get(trigger)
        return event is not None and self.state in event.transitions

    def trigger(self, trigger: str, now: float, reason: str | None = None) -> str:
        destinations = _DESTINATIONS.get(trigger)
        if destinations is None:
            raise ValueError(f"unknown trigger {trigger!r}; triggers: {', '.join(TRIGGERS)}")
        dest = destinations.get(self.state)
        if dest is None:
            raise IllegalTransition(self.state, trigger, self.task_id)
        self.state = dest
        self.history.append((self.state, now))
        if self.state in TERMINAL_STATES:
            self.reason = reason
        return self.state

    def accept(self, now: float) -> str:
        return self.trigger("accept", now)

    def reject(self, now: float, reason: str | None = None) -> str:
        return self.trigger("reject", now, reason)

    def admit(self, now: float) -> str:
        return self.trigger("admit", now)

    def suspend(self, now: float) -> str:
        return self.trigger("suspend", now)

    def preempt(self, now: float) -> str:
        return self.trigger("preempt", now)

    def finish_generation(self, now: float) -> str:
        return self.trigger("finish_generation", now)

    def complete(self, now: float, reason: str | None = None) -> str:
        return self.trigger("complete", now, reason)

    def fail(self, now: float, reason: str | None = None) -> str:
        return self.trigger("fail", now, reason)

    def cancel(self, now: float, reason: str | None = None) -> str:
        return self.trigger("cancel", now, reason)

    def time_of(self, state: str) -> float | None:
        """When the task last entered `state`, or None."""
        for s, t in reversed(self.history):
            if s == state:
                return t
        return None

    def __repr__(self) -> str:
        return f"TaskLifecycle(task_id={self.task_id!r}, state={self.state!r})"
