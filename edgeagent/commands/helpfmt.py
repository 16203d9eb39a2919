"""How every edgeagent parser talks to its user: help with each default shown once, and errors
that name the option or sub-command a typo probably meant.

argparse's ArgumentDefaultsHelpFormatter also prints "(default: None)" and "(default: False)"
for options that are unset or flags, and repeats a default the text already states. Python
3.11's argparse suggests nothing for ``edgeagent stauts`` or ``status --jsn``; the parser class
below adds "did you mean" to both errors. ``edgeagent.cli`` builds the top-level parser with it,
and argparse gives every sub-parser (and theirs) the class of its parent, so one class serves
every command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from edgeagent.sections import did_you_mean


class DefaultsFormatter(argparse.HelpFormatter):
    """Wraps descriptions to the terminal and appends ``(default: X)`` to options that have one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            "%(default)" in text
            or "default" in text
            or default in (None, False, argparse.SUPPRESS, [])
            or not action.option_strings
        ):
            return action.help
        return f"{text} (default: %(default)s)"


class SuggestingParser(argparse.ArgumentParser):
    """An ArgumentParser whose invalid-choice and unrecognized-argument errors suggest the
    closest valid name (difflib), reported by the sub-command's parser that was being used."""

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse's own check, with the hint put before the list of every choice.
        if action.choices is not None and value not in action.choices:
            choices = ", ".join(map(repr, action.choices))
            hint = did_you_mean([str(value)], map(str, action.choices), repr)
            raise argparse.ArgumentError(
                action, f"invalid choice: {value!r}{hint} (choose from {choices})"
            )

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._chosen(parsed)
            options = [o for o in parser._option_string_actions if o.startswith("--")]
            hint = did_you_mean([e.split("=")[0] for e in extras if e.startswith("-")], options)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost sub-command parser ``parsed`` went through (its options are the ones
        a stray argument was meant for, and its usage line the one to show)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, SuggestingParser):
                    return chosen._chosen(parsed)
        return self
