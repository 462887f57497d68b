"""VStreamCLI: LightningCLI whose errors name the mistake first, in a line or two.

LightningCLI (jsonargparse) answers a misspelt config key with the whole usage of every option (about
90 lines for a DataModule, a model and the Trainer) and the error last, and a misspelt argument of a
``class_path`` (a callback's, a transform's) with a dump of every type of the union it tried.
:class:`VStreamCLI` prints the error first, with the closest valid option, and a one-line pointer to
``--help`` instead of the usage. A :class:`~lightning_vstream.VStreamError` raised while the command runs
(an index that does not exist, a missing camera file) is printed as its message, without the
traceback that would bury it (``VSTREAM_DEBUG=1`` shows it). The config it saves next to the logs
(``config.yaml``) holds every ``storage_options`` secret as ``null``, as hyperparameters and
checkpoints do (:class:`RedactedSaveConfigCallback`).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
import sys
import traceback
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

from lightning_vstream.errors import ConfigurationError, VStreamError, debug_requested, user_message

__all__ = ["RedactedSaveConfigCallback", "VStreamArgumentParser", "VStreamCLI", "redact_config"]

#: jsonargparse's messages for an option it does not know, and how to read the option's full name.
_UNKNOWN = (
    re.compile(r"Subcommand '[^']+' does not accept option '(?P<key>[^']+)'"),
    re.compile(r"Group '(?P<group>[^']+)' does not accept option '(?P<key>[^']+)'"),
    re.compile(r"unrecognized arguments: --(?P<key>[^\s=]+)"),
    re.compile(r"Key '(?P<key>[^']+)' is not expected"),
)


#: jsonargparse's message for a ``class_path`` given an argument its class does not take.
_CLASS_OPTION = re.compile(
    r"Problem with given class_path '(?P<cls>[^']+)':\s*(?:Option|Key) '(?P<key>[^']+)' is not (?:accepted|expected)"
)
_PARSER_KEY = re.compile(r'Parser key "(?P<key>[^"]+)"')


def _class_arguments(path: str) -> list[str] | None:
    """The keyword arguments the class at dotted ``path`` takes, or None when it cannot be imported."""
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        parameters = inspect.signature(cls).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in kinds]


def class_argument_error(message: str) -> str | None:
    """One line for jsonargparse's union dump about a ``class_path`` given an argument it does not take.

    Example::

        >>> class_argument_error(
        ...     'Parser key "trainer.callbacks":\n  Does not validate against any of the Union subtypes\n  Errors:\n'
        ...     "    - Problem with given class_path 'lightning_vstream.callbacks.StreamThroughputMonitor':\n"
        ...     "        Option 'windw' is not accepted"
        ... )  # doctest: +SKIP
        "trainer.callbacks: lightning_vstream.callbacks.StreamThroughputMonitor does not accept option 'windw'; did you mean 'window'?"
    """
    found = _CLASS_OPTION.search(message)
    if found is None:
        return None
    cls, key = found["cls"], found["key"]
    where = _PARSER_KEY.search(message)
    line = f"{where['key'] + ': ' if where else ''}{cls} does not accept option {key!r}"
    accepted = _class_arguments(cls)
    if accepted is None:
        return line + "."
    close = difflib.get_close_matches(key, accepted, n=1, cutoff=0.6)
    if close:
        return f"{line}; did you mean {close[0]!r}?"
    return f"{line}; it accepts {', '.join(accepted) or 'no arguments'}."


def _moved_options() -> dict[str, list[str]]:
    """Each flat keyword the DataModules' option groups replaced -> its places (``"engine.num_workers"``)."""
    from lightning_vstream.clips.datamodule import CLIP_MOVES
    from lightning_vstream.stream.stream_datamodule import STREAM_MOVES

    places: dict[str, list[str]] = {}
    for table in (STREAM_MOVES, CLIP_MOVES):
        for group, (_, fields) in table.items():
            for old, new in fields.items():
                places.setdefault(old, []).append(f"{group}.{new}")
    return places


def closest_option(message: str, options: list[str]) -> str | None:
    """The valid option closest to the unknown one ``message`` names, if one is close enough; for a keyword
    that moved into an option group (``data.num_workers``), its new place (``data.engine.num_workers``).

    Example::

        >>> closest_option("Group 'data' does not accept option 'batch_sze'", ["data.batch_size", "data.seed"])
        'data.batch_size'
    """
    for pattern in _UNKNOWN:
        match = pattern.search(message)
        if match is None:
            continue
        key = match.group("key")
        group = match.groupdict().get("group")
        if group:
            key = f"{group}.{key}"
        prefix = key.rsplit(".", 1)[0] + "." if "." in key else ""
        moved = [
            prefix + place for place in _moved_options().get(key.rsplit(".", 1)[-1], ()) if prefix + place in options
        ]
        if moved:
            return moved[0]
        same_group = [o for o in options if o.startswith(prefix)] or options
        found = difflib.get_close_matches(key, same_group, n=1, cutoff=0.6)
        return found[0] if found else None
    return None


class VStreamArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with the error (and the closest valid option) first and no usage dump."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # a nested parser trying one type of a union: not the user's error yet
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self
        try:
            options = list(parser.get_defaults().keys())
        except Exception:  # defaults that cannot be built: no suggestion, the error still prints
            options = []
        close = closest_option(message, options)
        hint = f"; did you mean '{close}'?" if close else ""
        prog = parser.prog.replace(" [options]", "")
        one_line = class_argument_error(message)
        sys.stderr.write(f"error: {one_line}\n" if one_line else f"error: {message}{hint}\n")
        sys.stderr.write(f"tip: `{prog} --help` lists every option, `{prog} --print_config` prints them all.\n")
        self._logger.error(message)
        sys.exit(2)


class VStreamCLI(LightningCLI):
    """``LightningCLI`` with :class:`VStreamArgumentParser`: a misspelt option (of the config, of a callback's
    or a transform's ``init_args``) is named with the closest valid one, before anything else. Takes exactly
    LightningCLI's arguments.

    When it runs a subcommand (``run=True``, the default), a :class:`~lightning_vstream.VStreamError`
    raised while building the classes or running (a wrong index path, a missing camera file) is
    printed as its message, ``error: ...``, which names what is wrong and how to fix it, and the
    process exits with 2 for a configuration error and 1 for any other; ``VSTREAM_DEBUG=1`` prints
    the traceback as well. With ``run=False`` errors are raised to the caller, as LightningCLI does.

    Example::

        >>> from lightning_vstream import StreamVideoDataModule, VStreamCLI
        >>> from lightning_vstream.demos import TinyStreamPETR
        >>> cli = VStreamCLI(TinyStreamPETR, StreamVideoDataModule, run=False,
        ...                  args=["--data.index_file", "data/index.json"])  # doctest: +SKIP

    ``train.py fit`` with a config holding ``data: {batch_sze: 2}`` then stops with::

        error: Subcommand 'fit' does not accept option 'data.batch_sze'; did you mean 'data.batch_size'?
        tip: `train.py fit --help` lists every option, `train.py fit --print_config` prints them all.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("parser_class", VStreamArgumentParser)
        kwargs.setdefault("save_config_callback", RedactedSaveConfigCallback)
        if not kwargs.get("run", True):
            super().__init__(*args, **kwargs)
            return
        try:
            super().__init__(*args, **kwargs)
        except VStreamError as err:
            if debug_requested():
                traceback.print_exc()
            sys.stderr.write(f"error: {user_message(err)}\n")
            sys.exit(2 if isinstance(err, ConfigurationError) else 1)


def redact_config(config: Any) -> Any:
    """A copy of a parsed LightningCLI config with every secret of every storage group's ``options`` (and of any
    ``storage_options``) set to None.

    Example::

        >>> from jsonargparse import Namespace
        >>> config = Namespace(data=Namespace(storage=Namespace(options={"region": "eu", "secret_access_key": "s3cr3t"})))
        >>> redact_config(config).data.storage.options
        {'region': 'eu', 'secret_access_key': None}
    """
    from lightning_vstream.storage.config import SECRET_KEYS

    redacted = config.clone()
    for key, value in config.items():
        if (key.rsplit(".", 1)[-1] == "storage_options" or key.endswith("storage.options")) and isinstance(value, dict):
            redacted[key] = {k: (None if k in SECRET_KEYS else v) for k, v in value.items()}
    return redacted


class RedactedSaveConfigCallback(SaveConfigCallback):
    """LightningCLI's ``SaveConfigCallback`` that saves (and hands ``save_config``) the config with every
    ``storage_options`` secret set to None (see :func:`redact_config`): secrets stay in memory.

    :class:`VStreamCLI` uses it unless given another ``save_config_callback``; subclass it, not
    ``SaveConfigCallback``, to also log the config elsewhere. Takes exactly ``SaveConfigCallback``'s arguments.

    Example::

        >>> cli = VStreamCLI(TinyStreamPETR, StreamVideoDataModule,
        ...                  save_config_callback=RedactedSaveConfigCallback)  # doctest: +SKIP
    """

    def __init__(self, parser: LightningArgumentParser, config: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(parser, redact_config(config), *args, **kwargs)
