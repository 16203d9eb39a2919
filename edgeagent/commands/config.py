"""``edgeagent config check|show``: validate a config file, and list every key from the code.

Both read the settings classes themselves (``edgeagent.config.describe_config``), so what an
operator sees here, what the docs' reference (docs/configuration/reference.md) says and what
the daemon accepts cannot drift.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from edgeagent.api.secret_files import agent_group, exposures, secret_files
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.config import (
    DEFAULT_CONFIG_PATH,
    SECTIONS,
    TABLE_ARRAYS,
    Config,
    describe_config,
    load_config,
)
from edgeagent.hardware.profile import ProfileError, board_profiles
from edgeagent.sections import ConfigError, KeyDoc
from edgeagent.tls import ServerTls, TlsError

EXIT_INVALID = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "config",
        formatter_class=DefaultsFormatter,
        help="check a config file, or show every key with its value, unit and meaning",
        description=(
            "check: validate an agent.toml without starting the agent (every problem is named "
            "with its [section] key; the device profiles it points to are loaded too). show: "
            "every key of every section with its value (from the file) or default, its unit "
            "and a one-line description."
        ),
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    check = actions.add_parser(
        "check",
        formatter_class=DefaultsFormatter,
        help="validate a config file; exit 0 when usable, 2 with every problem named",
        description=(
            "Validate FILE (default: /etc/edgeagent/agent.toml, or the built-in defaults when "
            "it does not exist) exactly as `edgeagent run` would, and load the device profiles "
            "it names. Prints one line per problem and exits 2, or prints 'ok' and exits 0."
        ),
    )
    check.add_argument(
        "file",
        nargs="?",
        type=Path,
        metavar="FILE",
        help=f"config file (default: {DEFAULT_CONFIG_PATH})",
    )
    check.set_defaults(handler=run_check)
    show = actions.add_parser(
        "show",
        formatter_class=DefaultsFormatter,
        help="every key with its value or default, unit and description",
        description=(
            "Print every section and key as TOML: the value from --config (or the system file "
            "when it exists), or with --defaults the built-in default; each key with its unit "
            "and description as a comment. --markdown prints the docs' reference tables."
        ),
    )
    show.add_argument(
        "--config", type=Path, metavar="FILE", help=f"config file (default: {DEFAULT_CONFIG_PATH})"
    )
    form = show.add_mutually_exclusive_group()
    form.add_argument("--defaults", action="store_true", help="show the defaults, ignore any file")
    form.add_argument(
        "--markdown",
        action="store_true",
        help="the reference tables (docs/configuration/reference.md), defaults only",
    )
    show.add_argument("--json", action="store_true", help="print one JSON document")
    show.set_defaults(handler=run_show)


def check(path: Path | None) -> list[str]:
    """Every problem of the config at ``path`` (None: the system file, else the defaults)."""
    try:
        config = load_config(path)
    except ConfigError as exc:
        return exc.problems
    try:
        board_profiles(config.hardware.profiles_dir)
    except ProfileError as exc:
        return [f"[hardware] profiles_dir: {exc}"]
    if config.tls.enabled:  # a key that does not match its certificate would stop the start
        try:
            ServerTls(config.tls)
        except TlsError as exc:
            return [f"[tls] {exc}"]
    if config.server.deepstack_model:  # every DeepStack request would fail: say so now
        # The daemon's module loads the whole serving stack; only this check needs it.
        from edgeagent.api.http.deepstack_routes import deepstack_model_problem
        from edgeagent.config import package_dirs

        try:
            packages = package_dirs(config)
        except ConfigError as exc:
            return exc.problems
        problem = deepstack_model_problem(config.server.deepstack_model, packages)
        if problem is not None:
            return [problem]
    return []


def run_check(args: argparse.Namespace) -> int:
    if args.file is not None and not args.file.is_file():
        print(f"edgeagent config check: {args.file}: no such file", file=sys.stderr)
        return EXIT_INVALID
    problems = check(args.file)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return EXIT_INVALID
    source = args.file or (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None)
    for warning in exposed_secrets(source):  # usable, so ok; but say who else reads the secrets
        print(f"warning: {warning}", file=sys.stderr)
    print(f"{source}: ok" if source else "no config file: the built-in defaults apply: ok")
    return 0


def exposed_secrets(source: Path | None) -> list[str]:
    """A line for each file of the (valid) config at ``source`` that holds a secret others
    can read: checked against the agent's group, since the check runs as root or an operator."""
    config = load_config(source)
    files = secret_files(source, config.server, config.mqtt, config.agent.state_dir)
    return exposures(files, agent_group())


def _toml_value(value: Any, unit: str) -> str:
    """``value`` as a TOML literal (octal modes stay octal)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and unit == "octal mode":
        return oct(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, unit) for v in value) + "]"
    return json.dumps(str(value))


REDACTED = "redacted"


def _redacted(doc: KeyDoc, value: Any) -> bool:
    """True for a credential that is set: ``config show`` prints that it is, never what it is.

    Token files exist to keep the tokens out of what operators copy and paste (a config
    shown in a ticket, a terminal shared on a call); printing what was read from them would
    undo that.
    """
    return doc.secret and bool(value)


def _comment(doc: KeyDoc) -> str:
    return f"[{doc.unit}] {doc.description}" if doc.unit else doc.description


def render_toml(values: dict[str, dict[str, Any]], config: Config | None = None) -> str:
    """Every section and key as TOML, each key preceded by its unit and description; an array
    of tables ([[peer]]) once per table of ``config``, or as a commented-out template."""
    lines: list[str] = []
    for section, docs in describe_config().items():
        if section in TABLE_ARRAYS:
            tables = _array_values(config, section)
            for table in tables or [{doc.key: doc.default for doc in docs}]:
                lines.append(f"[[{section}]]" if tables else f"# [[{section}]]")
                lines += _key_lines(docs, table, commented=not tables)
                lines.append("")
            continue
        lines.append(f"[{section}]")
        lines += _key_lines(docs, values[section])
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _key_lines(docs: list[KeyDoc], values: dict[str, Any], commented: bool = False) -> list[str]:
    lines = []
    for doc in docs:
        lines.append(f"# {_comment(doc)}")
        value = values[doc.key]
        if value is None:
            lines.append(f"# {doc.key} =  (unset)")
        elif _redacted(doc, value):  # a comment: copied back, it sets nothing
            lines.append(f"# {doc.key} =  (set; {REDACTED})")
        else:
            lines.append(f"{'# ' * commented}{doc.key} = {_toml_value(value, doc.unit)}")
    return lines


def _array_values(config: Config | None, section: str) -> list[dict[str, Any]]:
    """Key → value of each table of an array of tables ([[peer]]) in ``config``."""
    if config is None:
        return []
    tables = getattr(config, TABLE_ARRAYS[section][0])
    return [{f.name: getattr(table, f.name) for f in fields(table)} for table in tables]


def _markdown_default(doc: KeyDoc) -> str:
    if doc.computed:
        return "computed (see description)"
    if doc.default is None:
        return "unset"
    return f"`{_toml_value(doc.default, doc.unit)}`"


def render_markdown() -> str:
    """The configuration reference as Markdown tables, one per TOML table (defaults only)."""
    lines: list[str] = []
    for section, docs in describe_config().items():
        header = f"[[{section}]]" if section in TABLE_ARRAYS else f"[{section}]"
        lines += [f"`{header}`", "", "| key | type | default | unit | description |"]
        lines.append("|---|---|---|---|---|")
        for doc in docs:
            text = doc.description.replace("|", "\\|")
            lines.append(
                f"| `{doc.key}` | {doc.kind} | {_markdown_default(doc)} | {doc.unit} | {text} |"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _shown(doc: KeyDoc, value: Any) -> Any:
    """The value as ``--json`` prints it: a set credential is the string ``<redacted>``."""
    return f"<{REDACTED}>" if _redacted(doc, value) else value


def _values(config: Config) -> dict[str, dict[str, Any]]:
    """Section → key → value, [server] merged from its listener and engine halves."""
    merged: dict[str, dict[str, Any]] = {}
    for section, owners in SECTIONS.items():
        merged[section] = {}
        for attr in owners:
            part = getattr(config, attr)
            merged[section].update((f.name, getattr(part, f.name)) for f in fields(part))
    return merged


def run_show(args: argparse.Namespace) -> int:
    if args.markdown:
        print(render_markdown(), end="")
        return 0
    try:
        config = Config() if args.defaults else load_config(args.config)
    except ConfigError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_INVALID
    values = _values(config)
    if args.json:
        document: dict[str, Any] = {
            section: _json_keys(docs, values[section])
            for section, docs in describe_config().items()
            if section not in TABLE_ARRAYS
        }
        for section in TABLE_ARRAYS:  # a list: one entry per table
            docs = describe_config()[section]
            document[section] = [_json_keys(docs, t) for t in _array_values(config, section)]
        print(json.dumps(document, indent=2, default=str))
        return 0
    print(render_toml(values, config), end="")
    return 0


def _json_keys(docs: list[KeyDoc], values: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "key": doc.key,
            "value": _shown(doc, values[doc.key]),
            "default": doc.default,
            "type": doc.kind,
            "unit": doc.unit,
            "description": doc.description,
        }
        for doc in docs
    ]
