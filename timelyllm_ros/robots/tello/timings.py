"""How long a Tello takes for each SDK command: the figures the command timeouts derive from."""

from __future__ import annotations

from dataclasses import dataclass

# SDK command words whose argument is a distance (cm) or an angle (degrees).
TRANSLATE_WORDS = frozenset({"forward", "back", "left", "right", "up", "down"})
TURN_WORDS = frozenset({"cw", "ccw"})


@dataclass(frozen=True)
class TelloTimings:
    """Expected command durations, used to derive timeouts (not to pace anything).

    Defaults match config/exec_model.yaml (translation 50 cm/s + 1.0 s, rotation 90 deg/s +
    1.0 s). exec_model.yaml has no takeoff/land entries (they fall back to its 1.0 s default);
    a real Tello needs several seconds for either, hence 5 s and 4 s here.
    """

    speed_cm_s: float = 50.0
    fixed_s: float = 1.0
    turn_deg_s: float = 90.0
    turn_fixed_s: float = 1.0
    takeoff_s: float = 5.0
    land_s: float = 4.0
    other_s: float = 0.5

    @classmethod
    def from_exec_model(cls, model) -> "TelloTimings":
        """Take translation/rotation figures from an ExecutionTimeModel (linear move_forward /
        turn_cw models); anything missing or not linear keeps the default."""
        kw = {}
        try:
            mf = model.model_for("move_forward")
            if getattr(mf, "kind", "") == "linear" and mf.per_unit_s > 0:
                kw.update(speed_cm_s=1.0 / mf.per_unit_s, fixed_s=mf.fixed_s)
            tc = model.model_for("turn_cw")
            if getattr(tc, "kind", "") == "linear" and tc.per_unit_s > 0:
                kw.update(turn_deg_s=1.0 / tc.per_unit_s, turn_fixed_s=tc.fixed_s)
        except AttributeError:
            pass
        return cls(**kw)

    def expected(self, command: str, speed_cm_s: float | None = None) -> float:
        word, _, rest = command.partition(" ")
        try:
            n = abs(float(rest.split()[0])) if rest else 0.0
        except ValueError:
            n = 0.0
        if word in TRANSLATE_WORDS:
            return self.fixed_s + n / (speed_cm_s or self.speed_cm_s)
        if word in TURN_WORDS:
            return self.turn_fixed_s + n / self.turn_deg_s
        if word == "takeoff":
            return self.takeoff_s
        if word == "land":
            return self.land_s
        return self.other_s
