"""The ``vstream`` command: build indexes, write stamped synthetic data, run the demo.

Exit codes: 0 on success; 1 when the command ran and failed or found problems (a corrupt or
changed file, an index that does not match its files); 2 when the command line is wrong (an
unknown option, a malformed value, a path that does not exist or is of the wrong kind,
conflicting options); 130 when interrupted. An error is printed as its message, which names what
is wrong and how to fix it; ``--debug`` (or ``VSTREAM_DEBUG=1``) prints its traceback as well.

Adding a command is one line in :data:`COMMANDS`: its name, its one-line help and the module that
implements it (see :mod:`lightning_vstream.commands` for what that module defines). Modules are
imported only for the command that runs, so ``vstream --help`` imports neither torch nor lightning.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["COMMANDS", "Command", "main"]


@dataclass(frozen=True)
class Command:
    """A ``vstream`` subcommand.

    Args:
        help: One line for ``vstream --help``.
        module: The module defining ``add_arguments(parser)`` and ``run(args) -> int``; imported only
            when this command runs or shows its help.
    """

    help: str
    module: str


#: The subcommands, in the order ``vstream --help`` lists them.
COMMANDS: dict[str, Command] = {
    "demo": Command(
        "build a small stamped dataset and train a tiny temporal model on it", "lightning_vstream.commands.demo"
    ),
    "synth": Command(
        "write a stamped synthetic dataset (accvlab layout + index.json)", "lightning_vstream.commands.synth"
    ),
    "index": Command(
        "scan a dataset tree and write index.json (or --check an index)", "lightning_vstream.commands.index"
    ),
    "encode": Command(
        "transcode an index (image folders or videos) to one video per camera", "lightning_vstream.commands.encode"
    ),
    "import-nuscenes": Command(
        "nuScenes tables + camera JPEGs -> videos, index and annotations",
        "lightning_vstream.commands.import_nuscenes",
    ),
    "preview": Command(
        "draw the first batches a model would receive (frames, labels, boxes) as one image",
        "lightning_vstream.commands.preview",
    ),
    "doctor": Command(
        "check whether this machine can decode on the GPU, correctly, and how fast", "lightning_vstream.commands.doctor"
    ),
}

_DESCRIPTION = """Frame-exact video loading for PyTorch Lightning: build and check indexes, encode image
datasets to video, import nuScenes, write stamped synthetic data, run the end-to-end demo.
'vstream COMMAND --help' describes each command."""

_EPILOG = """exit codes: 0 success, 1 the command failed or found problems, 2 the command line is wrong
(unknown option, malformed value, missing or wrong kind of path), 130 interrupted.
errors print as one message that says how to fix them; --debug or VSTREAM_DEBUG=1 adds the traceback."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows each option's default where it says something, and descriptions as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        # No "(default: None)" or "(default: False)" for options that are off unless given, and none
        # where the help text already says what the default is.
        if action.default in (None, []) or isinstance(action.default, bool) or "default" in text:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """Suggests the closest command for a misspelt one."""

    def error(self, message: str) -> Any:  # argparse's signature: NoReturn
        if "invalid choice:" in message and "argument COMMAND" in message:
            typed = message.split("invalid choice: ", 1)[1].split(" ", 1)[0].strip("'")
            close = difflib.get_close_matches(typed, list(COMMANDS), n=1)
            if close:
                message = f"{message}; did you mean {close[0]!r}?"
        super().error(message)


def _version() -> str:
    from lightning_vstream import __version__

    return f"vstream (lightning_vstream) {__version__}"


class _VersionAction(argparse.Action):
    """``--version``, reading the package metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("default", argparse.SUPPRESS)
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(_version())
        parser.exit()


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named in ``argv`` (the first word that is not an option), if any."""
    for word in argv:
        if not word.startswith("-"):
            return word
    return None


def _debug_option(parser: argparse.ArgumentParser, *, default: Any) -> None:
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help="on an error, print its traceback as well as its message (or set VSTREAM_DEBUG=1)",
    )


def _parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="vstream", description=_DESCRIPTION, epilog=_EPILOG, formatter_class=_HelpFormatter)
    parser.add_argument("--version", action=_VersionAction)
    _debug_option(parser, default=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv)
    for name, command in COMMANDS.items():
        child = sub.add_parser(name, help=command.help, epilog=_EPILOG, formatter_class=_HelpFormatter)
        _debug_option(child, default=argparse.SUPPRESS)  # also after the command; the top level's otherwise
        if name == chosen:  # only the command that runs imports its module
            module = importlib.import_module(command.module)
            module.add_arguments(child)
            child.set_defaults(run=module.run, command_parser=child)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``vstream`` console script.

    Args:
        argv: Arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, 1 when the command failed or found problems, 2 when the
        command line is wrong. Errors argparse finds itself (an unknown option, a malformed value)
        exit with 2 through ``SystemExit``, as argparse does.

    Example::

        >>> main(["synth", "data", "--clips", "2"])  # doctest: +SKIP
        0
    """
    from lightning_vstream.errors import ConfigurationError, VStreamError, debug_requested, user_message

    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = _parser(argv).parse_known_args(argv)
    if unknown:  # said by the command's own parser: `vstream index: error: ...`, with its usage line
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    name = f"vstream {args.command}"
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print(f"{name}: interrupted.", file=sys.stderr)
        return 130
    except (VStreamError, ValueError, OSError) as err:
        if args.debug or debug_requested():
            traceback.print_exc()
        if isinstance(err, VStreamError) or not isinstance(err, OSError):
            message = user_message(err)
        elif isinstance(err, PermissionError):
            where = f" {str(err.filename)!r}" if err.filename else ""
            message = (
                f"permission denied{where}: check the file's owner and mode, "
                "or run as a user who may read (and, for outputs, write) it."
            )
        elif isinstance(err, FileNotFoundError) and err.filename is not None:
            message = f"{str(err.filename)!r} does not exist."
        else:
            message = str(err)
        print(f"{name}: error: {message}", file=sys.stderr)
        return 2 if isinstance(err, ConfigurationError) else 1


if __name__ == "__main__":
    sys.exit(main())
