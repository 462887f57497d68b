"""The subcommands of ``vstream``, one module each (registered in :data:`lightning_vstream.cli.COMMANDS`).

A command module defines two functions and keeps its top-level imports light (argparse, pathlib):
``vstream --help`` imports no command module, and ``vstream NAME --help`` imports only that one.

- ``add_arguments(parser)``: set ``parser.description`` and add the command's arguments;
- ``run(args) -> int``: do the work (importing torch, av... inside), return the exit status.

Errors: raise :class:`~lightning_vstream.errors.ConfigurationError` for a wrong command line (an
option value, a path that does not exist or is of the wrong kind: exit status 2) and any other
:class:`~lightning_vstream.errors.VStreamError` when the work itself fails (exit status 1).

Each module is named after its subcommand, so three share a name with the module that does their
work: a command's module is its argument face, the other its implementation
(``commands/demo.py`` -> :mod:`lightning_vstream.demos.demo`, ``commands/synth.py`` ->
:mod:`lightning_vstream.demos.synth`, ``commands/doctor.py`` -> :mod:`lightning_vstream.doctor`).

- :mod:`~lightning_vstream.commands.index`: ``vstream index``, write an index or check one.
- :mod:`~lightning_vstream.commands.encode`: ``vstream encode``, one video per camera from an index.
- :mod:`~lightning_vstream.commands.import_nuscenes`: ``vstream import-nuscenes``.
- :mod:`~lightning_vstream.commands.synth`: ``vstream synth``, a stamped synthetic dataset.
- :mod:`~lightning_vstream.commands.demo`: ``vstream demo``.
- :mod:`~lightning_vstream.commands.preview`: ``vstream preview``, the first batches a model would receive.
- :mod:`~lightning_vstream.commands.doctor`: ``vstream doctor``, GPU decoding checked on this machine.
- :mod:`~lightning_vstream.commands.args`: argument types the commands share.
"""
