"""Bad input that can be blamed on one named field.

Every rejection a user sees (a goal, a TUF, a report) names the field and the reason, so they
share one type: callers can catch FieldError and report `.field` and `.reason` uniformly.
"""

from __future__ import annotations


class FieldError(ValueError):
    def __init__(self, field: str, reason: str):
        super().__init__(self.describe(field, reason))
        self.field = field
        self.reason = reason

    @staticmethod
    def describe(field: str, reason: str) -> str:
        return f"{field}: {reason}"
