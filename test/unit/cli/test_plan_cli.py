"""`timelyllm plan run PROGRAM`: a PROGRAM starting with "-" (a bare return, `->True`) is the
program, not an unknown option, wherever it stands among the options; real unknown options
and missing programs are still usage errors."""

from __future__ import annotations

import pytest

from timelyllm_ros.cli import main as top_cli


@pytest.mark.parametrize("argv", [
    ["plan", "run", "->True"],
    ["plan", "run", "->True", "--seed", "3"],
    ["plan", "run", "--quiet", "->True"],
    ["plan", "run", "--skill-set", "minispec", "->True", "--jitter"],
    ["plan", "run", "--", "->True"],
])
def test_a_program_starting_with_a_dash_runs(argv, capsys):
    assert top_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "outcome: done, returned True (the plan ended early)" in out
    assert "0 skill call(s)" in out


def test_a_dashed_program_with_calls_runs_them(capsys):
    # A return statement ends the plan after the calls before it; the turn is executed.
    assert top_cli.main(["plan", "run", "--quiet", "tc,30;->False"]) == 0
    out = capsys.readouterr().out
    assert "turn_cw(30) -> None" in out and "returned False" in out


@pytest.mark.parametrize("argv, message", [
    (["plan", "run", "--bogus", "->True"], "unrecognized arguments: --bogus"),
    (["plan", "run", "->True", "->False"], "unrecognized arguments: ->True ->False"),
    (["plan", "run", "tc,30", "->x"], "unrecognized arguments: ->x"),
    (["plan", "run", "--quiet"], "the following arguments are required: PROGRAM"),
])
def test_usage_errors_stay_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        top_cli.main(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_help_says_a_dashed_program_needs_no_double_dash(capsys):
    with pytest.raises(SystemExit):
        top_cli.main(["plan", "run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "usage: timelyllm plan run [options] PROGRAM" in out
    assert "one starting with '-' (\"->True\") is taken as is, no '--' needed" in out
