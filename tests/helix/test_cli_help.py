"""``helix --help`` and every command's ``--help``: flags show as flags (no ``<bool>``), and every
option says what it does."""

from __future__ import annotations

import pytest

from helix.cli import cli_command, main

COMMANDS = sorted(cli_command().commands)


@pytest.mark.parametrize("name", COMMANDS)
def test_help_shows_flags_as_flags_and_explains_every_option(name, capsys):
    assert main([name, "--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out, out
    command = cli_command().commands[name]
    silent = [p.name for p in command.params if p.param_type_name == "option" and not (p.help or "").strip()]
    assert not silent, f"helix {name}: options without help text: {silent}"


def test_top_level_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "<bool>" not in out and all(name in out for name in COMMANDS)
