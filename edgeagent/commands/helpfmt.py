"""The help formatter of every sub-command: each option's default shown once, where it has one.

argparse's ArgumentDefaultsHelpFormatter also prints "(default: None)" and "(default: False)"
for options that are unset or flags, and repeats a default the text already states.
"""

from __future__ import annotations

import argparse


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
