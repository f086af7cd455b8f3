"""What every ``cormorant`` command group shares: reading a secret the one way (the option
``--password-file PATH``, ``-`` for standard input), printing tables, and keeping an old
command or option working, hidden, with a deprecation line on standard error."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

PASSWORD_FILE_HELP = (
    "Read the password from this file ('-': standard input; one trailing newline dropped). "
    "Without it the password is asked for."
)


def read_secret(source: Path | str) -> bytes:
    """The secret in file ``source`` (``-``: standard input), one trailing newline (``\\n``
    or ``\\r\\n``) dropped. Raises ``click.UsageError`` when the file cannot be read."""
    try:
        data = sys.stdin.buffer.read() if str(source) == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise click.UsageError(f"--password-file {source}: {exc.strerror}") from None
    for end in (b"\r\n", b"\n"):
        if data.endswith(end):
            return data[: -len(end)]
    return data


def deprecated(old: str, new: str) -> None:
    """Say on standard error that ``old`` (a command or option) is deprecated for ``new``."""
    click.echo(f"cormorant: {old} is deprecated and will be removed; use {new}", err=True)


def alias(command: click.Command, old_name: str, new: str) -> click.Command:
    """A hidden command ``old_name`` doing what ``command`` does, after a deprecation line
    naming ``new`` (the command to use instead)."""
    target = command.callback
    assert target is not None

    def callback(**kwargs: Any) -> Any:
        deprecated(f"'{old_name}'", f"'{new}'")
        return click.get_current_context().invoke(target, **kwargs)

    return click.Command(
        old_name,
        params=list(command.params),
        callback=callback,
        hidden=True,
        help=f"Deprecated: use '{new}'.",
    )


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """``rows`` under ``header`` in columns as wide as their widest cell."""
    table = [tuple(header), *(tuple(row) for row in rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def deprecated_option(old: str, new: str, *names: str, **attrs: Any) -> Callable[[Any], Any]:
    """A hidden option ``old`` whose use prints a deprecation line naming ``new``; the
    command receives its value as usual (``names``: the parameter's name, if not the
    option's; ``attrs``: :func:`click.option`'s)."""

    def warn(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value not in (None, False, ()):
            deprecated(old, new)
        return value

    return click.option(old, *names, hidden=True, callback=warn, **attrs)
