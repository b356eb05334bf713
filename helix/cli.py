"""The ``helix`` command line: one Typer app, commands contributed by ``helix.commands.*``.

User errors (:class:`helix.core.errors.HelixUserError`) are printed as one red line with exit code 2;
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

# gRPC's C core logs an INFO line each time Ray forks while a gRPC thread runs; a user gains
# nothing from them. Must be set before grpc is first imported.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

import typer

from helix.commands import COMMAND_MODULES
from helix.core.errors import HelixUserError

app = typer.Typer(
    name="helix",
    help="Serve one LLM on mixed GPUs across regions: plan layer placement by max flow, "
         "simulate it on real traces, and serve it behind an OpenAI-compatible API.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _module in COMMAND_MODULES:
    importlib.import_module(_module).register(app)


def _flags_as_flags(command) -> None:
    """Typer's help prints a type for every option, ``--json <bool>`` and even ``--help <bool>``;
    a flag takes no value, so it shows none (for ``command`` and its subcommands)."""
    for cmd in [command, *getattr(command, "commands", {}).values()]:
        for param in cmd.params:
            if getattr(param, "is_flag", False):
                param.metavar = ""
        make_help = cmd.get_help_option

        def help_option(ctx, _make=make_help):
            option = _make(ctx)
            if option is not None:
                option.metavar = ""
            return option
        cmd.get_help_option = help_option


def cli_command():
    """The click command behind ``helix`` (what :func:`main` runs)."""
    command = typer.main.get_command(app)
    _flags_as_flags(command)
    return command


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``helix`` console script. Returns the exit code."""
    try:
        result = cli_command().main(args=argv, prog_name="helix", standalone_mode=False)
    except HelixUserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except Exception as exc:
        # Usage errors (missing argument, bad option value). Typer bundles its own copy of click,
        # so match the shape of click's exceptions rather than one class.
        if hasattr(exc, "format_message") and isinstance(getattr(exc, "exit_code", None), int):
            message = exc.format_message()
            if message:  # empty when the help was shown for a bare `helix`
                args = argv if argv is not None else sys.argv[1:]
                known = {c.name for c in app.registered_commands}
                command = f"{args[0]} " if args and args[0] in known else ""
                print(f"error: {message} (see: helix {command}--help)", file=sys.stderr)
            return exc.exit_code
        raise
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
