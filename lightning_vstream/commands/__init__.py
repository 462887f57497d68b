"""The subcommands of ``vstream``, one module each (registered in :data:`lightning_vstream.cli.COMMANDS`).

A command module defines two functions and keeps its top-level imports light (argparse, pathlib):
``vstream --help`` imports no command module, and ``vstream NAME --help`` imports only that one.

- ``add_arguments(parser)``: set ``parser.description`` and add the command's arguments;
- ``run(args) -> int``: do the work (importing torch, av... inside), return the exit status.

Errors: raise :class:`~lightning_vstream.errors.ConfigurationError` for a wrong command line (an
option value, a path that does not exist or is of the wrong kind: exit status 2) and any other
:class:`~lightning_vstream.errors.VStreamError` when the work itself fails (exit status 1).
"""
