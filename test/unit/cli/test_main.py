"""`timelyllm <command>` dispatches to timelyllm_ros.cli.<command>.main(argv)."""

from __future__ import annotations

import importlib

import pytest

from timelyllm_ros.cli import main as top_cli


@pytest.mark.parametrize("command", sorted(top_cli.SUBCOMMANDS))
def test_every_command_has_its_module_with_main(command):
    module = importlib.import_module(top_cli.command_module(command))
    # A command spelt with a hyphen lives in a module with an underscore.
    assert module.__name__ == f"timelyllm_ros.cli.{command.replace('-', '_')}"
    assert callable(module.main)


@pytest.mark.parametrize("command", ["demo", "launch", "profile", "router-compare"])
def test_command_help_is_the_commands_own(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        top_cli.main([command, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: timelyllm {command} ")


def test_no_command_prints_usage_and_fails(capsys):
    assert top_cli.main([]) == 2
    assert "usage: timelyllm" in capsys.readouterr().out
    assert top_cli.main(["--help"]) == 0


def test_unknown_command_is_rejected(capsys):
    with pytest.raises(SystemExit) as exit_:
        top_cli.main(["no-such-command"])
    assert exit_.value.code == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_launch_reports_a_bad_description(tmp_path, capsys):
    bad = tmp_path / "bad.nodes.yaml"
    bad.write_text("nodes: 3\n")
    assert top_cli.main(["launch", str(bad)]) == 2
    assert "timelyllm launch:" in capsys.readouterr().err
