"""``hub sign``: a model package, or with ``--agent`` wheelhouses, into a signed release."""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import (
    emit,
    release_serials,
    release_targets,
    release_window,
    run,
    serials_argument,
    window_arguments,
)
from edgeagent.fleet.release_canary import ReleaseCanary
from edgeagent.hub.keys import HubError


def add_sign(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sign",
        formatter_class=DefaultsFormatter,
        help="build a package's artifact and signed release manifest",
        description="Pack PACKAGE_DIR into a reproducible .tar.gz and write "
        "<name>-<version>.release.json, the manifest signed with the release key(s). "
        "--base-url is where 'hub serve' publishes --out.",
    )
    parser.add_argument(
        "package",
        type=Path,
        metavar="PACKAGE_DIR",
        help="the model package (with --agent: a directory of wheels, the agent's and its "
        "dependencies', for --platform)",
    )
    agent = parser.add_argument_group("agent releases (signed by the agent key, not a model key)")
    agent.add_argument(
        "--agent",
        action="store_true",
        help="sign an agent release: PACKAGE_DIR is a wheelhouse (pip wheel . -w DIR)",
    )
    agent.add_argument(
        "--platform",
        help="PACKAGE_DIR's platform tag, e.g. linux_aarch64 (default: this machine's)",
    )
    agent.add_argument(
        "--wheelhouse",
        action="append",
        default=[],
        metavar="PLATFORM=DIR",
        help="another platform's wheelhouse in the same release (repeat)",
    )
    agent.add_argument("--python", help="the wheels' Python version (default: this one's)")
    parser.add_argument(
        "--key",
        action="append",
        type=Path,
        required=True,
        dest="keys",
        metavar="PEM",
        help="release private key (repeat for a threshold)",
    )
    parser.add_argument("--base-url", required=True, help="e.g. http://hub.example:8000")
    parser.add_argument("--out", type=Path, default=Path("."), help="artifact directory")
    parser.add_argument("--trust", type=Path, help="check the result against this trust file")
    parser.add_argument(
        "--expires-days", type=float, default=30.0, help="days until devices refuse the release"
    )
    parser.add_argument("--deployment-id", help="id the devices report back (default: generated)")
    parser.add_argument("--profile", action="append", default=[], help="target profile")
    parser.add_argument("--device-class", action="append", default=[], help="target class")
    parser.add_argument("--device-id", action="append", default=[], help="target device")
    parser.add_argument(
        "--min-agent-version", default="0.0.0", help="older agents refuse the release"
    )
    parser.add_argument(
        "--encrypt",
        action="store_true",
        help="seal every variant (AES-256-GCM) for the --recipients devices' X25519 keys",
    )
    parser.add_argument(
        "--recipients",
        type=Path,
        metavar="FILE",
        help="device id = public key, as devices report it (TOML, or JSON for *.json)",
    )
    parser.add_argument(
        "--canary",
        nargs="?",
        const="",
        metavar="KEY=VALUE,...",
        help="devices run the new version beside the old one on live traffic before "
        "committing it: share, min_requests, max_error_rate, max_p99_ratio, max_seconds "
        "(e.g. share=0.1,min_requests=200); a key left out takes the device's default",
    )
    parser.add_argument(
        "--delta-from",
        type=Path,
        metavar="RELEASE_JSON",
        help="also publish patches from this earlier release's artifacts (in --out; with "
        "--agent an earlier agent release): devices holding it download only the patch "
        "(docs/fleet/deltas.md); needs agents that read deltas",
    )
    parser.add_argument(
        "--delta-max-ratio",
        type=float,
        default=0.8,
        help="offer a patch only when at most this fraction of its full artifact",
    )
    window_arguments(parser)
    serials_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.encrypt import load_recipients
        from edgeagent.hub.sign import sign_package

        if args.agent:
            return _sign_agent(args)
        if args.encrypt != (args.recipients is not None):
            raise HubError("--encrypt and --recipients FILE go together")
        recipients = load_recipients(args.recipients) if args.encrypt else None
        args.out.mkdir(parents=True, exist_ok=True)
        artifact, envelope = sign_package(
            args.package,
            key_paths=args.keys,
            base_url=args.base_url,
            out_dir=args.out,
            targets=release_targets(args),
            expires_in=timedelta(days=args.expires_days),
            deployment_id=args.deployment_id,
            min_agent_version=args.min_agent_version,
            trust_path=args.trust,
            serials=release_serials(args),
            recipients=recipients,
            canary=None if args.canary is None else _canary(args.canary),
            delta_from=args.delta_from,
            window=release_window(args.window, args.window_timezone),
            delta_max_ratio=args.delta_max_ratio,
        )
        data = {"artifact": str(artifact), "release": str(envelope)}
        emit(args, data, f"artifact {artifact}\nrelease  {envelope}")
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))


def _sign_agent(args: argparse.Namespace) -> int:
    """``hub sign --agent``: wheelhouses into a signed agent release (hub.agent_release)."""
    from edgeagent.fleet.agent_manifest import this_platform
    from edgeagent.hub.agent_release import sign_agent_release

    if args.encrypt or args.canary is not None or args.window:
        raise HubError("--encrypt, --canary and --window are for model releases, not --agent")
    wheelhouses = {args.platform or this_platform(): args.package}
    for entry in args.wheelhouse:
        tag, sep, directory = entry.partition("=")
        if not sep or not tag or not directory:
            raise HubError(f"--wheelhouse {entry!r}: must be PLATFORM=DIR")
        wheelhouses[tag] = Path(directory)
    envelope = sign_agent_release(
        wheelhouses,
        key_paths=args.keys,
        base_url=args.base_url,
        out_dir=args.out,
        python=args.python,
        targets=release_targets(args),
        expires_in=timedelta(days=args.expires_days),
        deployment_id=args.deployment_id,
        serials=release_serials(args),
        trust_path=args.trust,
        delta_from=args.delta_from,
        delta_max_ratio=args.delta_max_ratio,
    )
    emit(args, {"release": str(envelope)}, f"agent release {envelope}")
    return 0


def _canary(text: str) -> ReleaseCanary:
    """``--canary KEY=VALUE,...``; a bad value is a usage error naming the key and bounds."""
    try:
        return ReleaseCanary.from_option(text)
    except ValueError as exc:
        raise HubError(f"--canary: {exc}") from exc
