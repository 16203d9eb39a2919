"""``hub keygen`` and ``hub rotate``: the trust engineer's commands (root, release and agent keys,
trust files).
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import emit, run
from edgeagent.hub.keys import HubError


def add_keygen(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "keygen",
        formatter_class=DefaultsFormatter,
        help="create root and release keys and the initial trust file",
        description="Create root and release Ed25519 key pairs (PEM, private keys mode 0600) "
        "and DIR/trust.json, the trust file devices are provisioned with ([updates] trust_file). "
        "Keep the root keys offline; the release key signs day-to-day releases.",
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="where keys and trust.json go")
    parser.add_argument("--root-keys", type=int, default=1, help="root key pairs to create")
    parser.add_argument("--release-keys", type=int, default=1, help="release key pairs to create")
    parser.add_argument(
        "--agent-keys",
        type=int,
        default=0,
        help="agent key pairs to create (they alone sign agent releases: hub sign --agent)",
    )
    parser.add_argument(
        "--root-threshold", type=int, default=1, help="root signatures a trust change needs"
    )
    parser.add_argument(
        "--release-threshold", type=int, default=1, help="release signatures a release needs"
    )
    parser.add_argument(
        "--expires-days", type=int, default=365, help="days until the trust file expires"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")

    def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.keys import keygen

        args.directory.mkdir(parents=True, exist_ok=True)
        result = keygen(
            args.directory,
            root_keys=args.root_keys,
            release_keys=args.release_keys,
            root_threshold=args.root_threshold,
            release_threshold=args.release_threshold,
            expires_in=timedelta(days=args.expires_days),
            agent_keys=args.agent_keys,
        )
        keys = [{"name": k.name, "key": str(k.key_path), "keyid": k.keyid} for k in result.keys]
        lines = [f"{k['name']:<12} {k['keyid'][:16]}…  {k['key']}" for k in keys]
        lines.append(f"trust file v{result.version}: {result.trust_path}")
        emit(args, {"keys": keys, "trust": str(result.trust_path)}, "\n".join(lines))
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))


def add_rotate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "rotate",
        formatter_class=DefaultsFormatter,
        help="write trust file N+1, signed by the old and the new root keys",
        description="Write the next trust file version over TRUST (or --out). Devices accept "
        "it only when a threshold of the current root keys and of the new ones signed it; "
        "publish it to a group with 'hub publish --trust-file'.",
    )
    parser.add_argument("trust", type=Path, metavar="TRUST", help="the current trust file")
    parser.add_argument(
        "--root-key",
        action="append",
        type=Path,
        required=True,
        dest="old",
        help="a current root private key (repeat up to the threshold)",
    )
    parser.add_argument(
        "--new-root-key",
        action="append",
        type=Path,
        default=[],
        dest="new",
        help="a new root private key (none: the root keys stay)",
    )
    parser.add_argument(
        "--release-pub",
        action="append",
        type=Path,
        default=[],
        help="release public key of the new trust (none: the current ones)",
    )
    parser.add_argument(
        "--root-threshold", type=int, help="new root threshold (default: unchanged)"
    )
    parser.add_argument(
        "--release-threshold", type=int, help="new release threshold (default: unchanged)"
    )
    parser.add_argument(
        "--expires-days", type=int, default=365, help="days until the new trust file expires"
    )
    parser.add_argument("--out", type=Path, help="write here instead of over TRUST")
    parser.add_argument(
        "--reset-floor",
        action="append",
        default=[],
        metavar="MODEL=VERSION",
        help="set MODEL's anti-rollback floor on every device to VERSION (recovery from a "
        "leaked release key: revoke it with --release-pub in the same rotation)",
    )

    def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.keys import rotate

        resets = dict(item.partition("=")[::2] for item in args.reset_floor)
        if any(not model or not version for model, version in resets.items()):
            raise HubError("--reset-floor wants MODEL=VERSION, e.g. mobilenet_v2=1.4.0")

        path = rotate(
            args.trust,
            old_root_keys=args.old,
            new_root_keys=args.new,
            release_pubs=args.release_pub,
            root_threshold=args.root_threshold,
            release_threshold=args.release_threshold,
            expires_in=timedelta(days=args.expires_days),
            out_path=args.out,
            floor_resets=resets,
        )
        print(f"wrote {path}")
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))
