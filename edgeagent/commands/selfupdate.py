"""``edgeagent agent-update init|boot-check|check-state|status``: agent self-updates.

``init`` makes a root from a directory of wheels (the first version: later ones arrive as
signed agent releases) and prints the systemd drop-in that runs the agent from it;
``boot-check`` is what ``<root>/boot-check`` runs before each start; ``check-state`` says what
this version would do with a state directory (the running agent runs a new version's before a
switch); ``status`` shows the versions, links, committed serial, any switch on trial and the
state snapshot kept for its rollback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter

DEFAULT_ROOT = Path("/opt/edgeagent")


def dropin(root: Path) -> str:
    """The unit drop-in of an A/B install (``systemctl edit edgeagent``).

    ``RestartPreventExitStatus=`` (emptied): a version on trial that exits 2 at start (a config
    or state it refuses) must still be restarted, or the boot check never runs to roll it back.
    """
    return (
        "[Service]\n"
        f"ExecStartPre=\nExecStartPre={root}/boot-check\n"
        f"ExecStart=\nExecStart={root}/current/venv/bin/edgeagent run\n"
        "Restart=always\n"
        "RestartPreventExitStatus=\n"
        f"ReadWritePaths={root}\n"
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "agent-update",
        help="the A/B root of agent self-updates: init, boot check, status",
        description="Agent self-updates install each version into <root>/versions/<v>/venv "
        "and switch <root>/current with a boot-counted, health-checked commit "
        "(docs/fleet/agent-updates.md). Set [updates] agent_root to the same root.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init",
        formatter_class=DefaultsFormatter,
        help="install the first version from a directory of wheels and print the drop-in",
    )
    init.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the A/B root")
    init.add_argument(
        "--wheelhouse", type=Path, required=True, help="directory of wheels (pip wheel . -w DIR)"
    )
    init.add_argument(
        "--extra-site-dir",
        type=Path,
        action="append",
        default=[],
        help="also read this site directory ([updates] agent_extra_site_dirs)",
    )
    init.add_argument("--timeout", type=float, default=600.0, help="venv + pip install, seconds")
    init.set_defaults(handler=run_init)
    boot = actions.add_parser(
        "boot-check",
        formatter_class=DefaultsFormatter,
        help="count a start of a version on trial, or roll it back (exits 0)",
    )
    boot.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the A/B root")
    boot.set_defaults(handler=lambda args: _boot(args.root))
    check = actions.add_parser(
        "check-state",
        formatter_class=DefaultsFormatter,
        help="can this version read the state directory? (exit 0 yes, perhaps migrating; 2 no)",
    )
    check.add_argument(
        "--config", type=Path, metavar="FILE", help="agent.toml naming [agent] state_dir"
    )
    check.add_argument(
        "--state-dir", type=Path, metavar="DIR", help="the state directory (instead of --config)"
    )
    check.set_defaults(handler=run_check_state)
    status = actions.add_parser(
        "status",
        formatter_class=DefaultsFormatter,
        help="versions, links, serial, a switch on trial",
    )
    status.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="the A/B root")
    status.add_argument("--json", action="store_true", help="print one JSON document")
    status.set_defaults(handler=run_status)


def _boot(root: Path) -> int:
    from edgeagent.selfupdate.boot import main

    return main(["--root", str(root)])


def run_init(args: argparse.Namespace) -> int:
    from edgeagent.hub.agent_release import agent_version_of
    from edgeagent.hub.keys import HubError
    from edgeagent.selfupdate.install import InstallError, InstallSettings, install_version
    from edgeagent.selfupdate.layout import Layout

    layout = Layout(args.root)
    try:
        version = agent_version_of(args.wheelhouse)
        if layout.current() is not None:
            print(f"edgeagent agent-update init: {args.root} has a current version already")
            return 2
        settings = InstallSettings(
            timeout_s=args.timeout,
            max_unpacked_bytes=1 << 40,
            extra_site_dirs=tuple(args.extra_site_dir),
        )
        install_version(layout, version, args.wheelhouse, settings)
        layout.adopt(version)
    except (HubError, InstallError, OSError) as exc:
        print(f"edgeagent agent-update init: {exc}", file=sys.stderr)
        return 2
    print(f"{args.root}: agent {version} installed and current")
    print(f"systemd drop-in (systemctl edit edgeagent), and set [updates] agent_root = "
          f'"{args.root}":\n{dropin(args.root)}', end="")  # fmt: skip
    return 0


def run_check_state(args: argparse.Namespace) -> int:
    from edgeagent.config import load_config
    from edgeagent.sections import ConfigError
    from edgeagent.selfupdate.stateformat import StateFormatError, plan

    try:
        state_dir = args.state_dir or load_config(args.config).agent.state_dir
        todo = plan(state_dir)
        todo.check_restorable()
    except (ConfigError, StateFormatError) as exc:
        print(f"edgeagent agent-update check-state: {exc}", file=sys.stderr)
        return 2
    print(todo.describe())
    return 0


def run_status(args: argparse.Namespace) -> int:
    from edgeagent.selfupdate import snapshot
    from edgeagent.selfupdate.layout import Layout
    from edgeagent.selfupdate.state import StateError, SwitchState

    layout, state = Layout(args.root), SwitchState(args.root)
    try:
        pending, record = state.pending(), state.record()
        saved = snapshot.load(args.root)
    except StateError as exc:
        print(f"edgeagent agent-update status: {exc}", file=sys.stderr)
        return 2
    document = {
        "root": str(args.root),
        "current": layout.current(),
        "previous": layout.previous(),
        "installed": layout.installed(),
        "committed": {"version": record.version, "serial": record.serial},
        "bad": record.bad,
        "pending": None if pending is None else pending.__dict__ | {"models": list(pending.models)},
        "state_snapshot": None if saved is None else saved.__dict__,
    }
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print(f"current {document['current']}  previous {document['previous']}")
        print(f"installed {', '.join(layout.installed()) or '-'}; bad {record.bad or '-'}")
        print(f"committed serial {record.serial}; pending: {pending or '-'}")
        if saved is not None:
            print(f"state snapshot for {saved.to_version}: format {saved.format}, {saved.saved}")
    return 0
