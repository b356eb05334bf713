"""CLI command modules. Each exposes ``register(app: typer.Typer) -> None``.

``helix.cli`` imports every module named in :data:`COMMAND_MODULES` (in this order) and lets it add
its commands, so a new subsystem adds one line here and keeps its CLI code in its own module.
Command modules import heavy subsystems lazily, inside the command function, so ``helix --help``
stays fast.
"""

COMMAND_MODULES: tuple[str, ...] = (
    "helix.commands.validate",
    "helix.commands.plan",
    "helix.commands.simulate",
    "helix.commands.serve",
    "helix.commands.bench",
    "helix.commands.drain",
    "helix.commands.replan",
    "helix.commands.profile",
    "helix.commands.keys",
)
