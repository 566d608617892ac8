"""``--help`` placeholders in words (``--job JOB``, ``--top N``), not the Python types typer shows by default.

:class:`WordsGroup` is the click group class of ``tracelake`` and ``tracelake report``: every
command it hands out has its placeholders set from :data:`WORDS` (flags get none), so a new
option gets a word without anyone remembering to write ``metavar=``.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperArgument, TyperGroup, TyperOption

# typer carries its own click (typer._click): its types, not the click package's, are what typer builds.
Command = Any
Context = Any
Parameter = Any

#: The placeholder of each option, by its long name; others get their name in capitals.
WORDS: dict[str, str] = {
    "--home": "DIR", "--job": "JOB", "--label": "KEY=VALUE", "--workers": "N", "--scheduler": "ADDRESS",
    "--format": "table|csv|json", "--out": "PATH", "--top": "N", "--since": "WHEN", "--until": "WHEN",
    "--window": "DURATION", "--stale-after": "SECONDS", "--host": "HOST", "--port": "PORT",
    "--tokens-file": "FILE", "--ingest-workers": "N",
}
#: The placeholder of each argument, by its parameter name; others get their name in capitals.
ARGUMENTS: dict[str, str] = {"paths": "PATH", "trace_id": "TRACE", "a": "A", "b": "B", "query": "SQL",
                             "job": "JOB"}


def word_for(param: Parameter) -> str:
    """The placeholder ``param`` shows in ``--help``: empty for a flag."""
    if isinstance(param, TyperOption) or getattr(param, "param_type_name", "") == "option":
        if param.is_flag or param.count:
            return ""
        long = next((o for o in param.opts if o.startswith("--")), param.opts[0])
        return WORDS.get(long, long.lstrip("-").replace("-", "_").upper())
    return ARGUMENTS.get(param.name or "", (param.name or "value").upper())


def _name_placeholders(params: list[Parameter]) -> None:
    for param in params:
        if param.metavar is None:
            param.metavar = word_for(param)
        if isinstance(param, TyperArgument):
            # the name column shows the argument's word already: no Python type beside it
            param.display_type_rich = _no_type  # type: ignore[method-assign]


def _no_type(ctx: Context) -> None:
    return None


class WordsGroup(TyperGroup):
    """A typer group whose commands (and itself) show words as ``--help`` placeholders."""

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None and not isinstance(command, WordsGroup):
            _name_placeholders(command.get_params(ctx))
        return command

    def get_params(self, ctx: Context) -> list[Parameter]:
        params: list[Parameter] = super().get_params(ctx)
        _name_placeholders(params)
        return params
