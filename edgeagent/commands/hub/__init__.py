"""edgeagent hub: the fleet manager's commands, one sub-command per job.

    keygen DIR           root + release keys and the initial trust file devices are given
    sign PACKAGE_DIR     build the reproducible artifact and its signed release manifest
    serve DIR            serve artifacts over HTTP with Range / If-Range (resumable downloads)
    publish RELEASE      put a verified release on the broker for a group and/or devices
    unpublish MODEL      clear a model's retained release in a group
    rollback MODEL       sign the kept release of an older version anew and publish it
    rollout RELEASE      staged deployment (5 % → 25 % → 100 %) with an abort threshold
    status               the fleet table from the devices' retained MQTT reports
    server               the fleet manager as a service (database, REST API, durable rollouts)
    rotate TRUST         trust file N+1 signed by the old and the new root keys

Every command exits 0 on success, 2 on a usage or input error (a bad key, package or release
file, an unreachable or malformed --broker), 1 when the work itself failed (a rollout aborted),
and prints a one-line reason on standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.fleet.canary import ReleaseCanary
from edgeagent.fleet.manifest import Targets
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import TrustError
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hub.keys import HubError, trust_chain
from edgeagent.hub.policy import PolicyError, StagedPolicy

EXIT_FAILED = 1
EXIT_USAGE = 2


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hub",
        help="fleet manager: keys, signing, publishing, artifact server, rollouts, fleet status",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="hub_command", metavar="HUB_COMMAND")
    _keygen(commands)
    _sign(commands)
    _serve(commands)
    _publish(commands)
    _unpublish(commands)
    _rollback(commands)
    _rollout(commands)
    _status(commands)
    _rotate(commands)
    # ---- hub server, and --server for status / rollout (edgeagent/commands/hub_server.py) ----
    from edgeagent.commands import hub_server

    hub_server.register(
        commands,
        broker_arguments=_broker_arguments,
        mqtt_settings=mqtt_settings,
        run=_run,
        emit=_emit,
    )
    # ------------------------------------------------------------------------------------------
    parser.set_defaults(handler=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_USAGE


def _run(args: argparse.Namespace, work) -> int:
    """Run one command body; the hub's and the trust code's errors are input errors (exit 2)."""
    try:
        result = work(args)
        if asyncio.iscoroutine(result):
            result = asyncio.run(result)
        return int(result or 0)
    except (HubError, TrustError) as exc:
        print(f"edgeagent hub {args.hub_command}: {exc}", file=sys.stderr)
        return EXIT_USAGE  # what the operator gave cannot be used: keys, files, broker


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if getattr(args, "json", False) else text)


# ---- broker options shared by publish, rollout and status ----------------------------------


def _broker_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker")
    group.add_argument(
        "--broker", default="127.0.0.1:1883", metavar="HOST:PORT", help="the fleet's MQTT broker"
    )
    group.add_argument(
        "--prefix", default="edgeagent", help="topic prefix (the devices' [mqtt] topic_prefix)"
    )
    group.add_argument("--username", default="", help="broker user name (empty: anonymous)")
    group.add_argument(
        "--password-file", type=Path, help="file holding the broker password (not on argv)"
    )
    group.add_argument("--ca", type=Path, help="CA certificate of the broker: enables TLS")
    group.add_argument("--cert", type=Path, help="client certificate for mutual TLS")
    group.add_argument("--key", dest="cert_key", type=Path, help="client certificate's key")


def mqtt_settings(args: argparse.Namespace) -> MqttSettings:
    host, _, port = args.broker.rpartition(":")
    if not host or not port.isdigit():
        raise HubError(f"--broker {args.broker!r}: expected HOST:PORT")
    password = ""
    if args.password_file is not None:
        try:
            password = args.password_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise HubError(f"--password-file {args.password_file}: {exc.strerror}") from exc
    settings = MqttSettings(
        host=host.strip("[]"),
        port=int(port),
        topic_prefix=args.prefix,
        username=args.username,
        password=password,
        tls=args.ca is not None,
        ca_file=args.ca,
        cert_file=args.cert,
        key_file=args.cert_key,
    )
    try:
        settings.validate()
    except ValueError as exc:
        raise HubError(str(exc).replace("[mqtt] ", "--")) from exc
    return settings


def _serials_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serials",
        type=Path,
        help="the per-model release serial counters (default: serials.json beside the key)",
    )


def _targets(args: argparse.Namespace) -> Targets:
    """The devices a signed release is for, from --profile/--device-class/--device-id."""
    return Targets(
        profiles=tuple(args.profile),
        device_classes=tuple(args.device_class),
        device_ids=tuple(args.device_id),
    )


def _serials(args: argparse.Namespace):
    from edgeagent.hub.serials import ReleaseSerials

    return None if args.serials is None else ReleaseSerials(args.serials)


# ---- keygen / sign / rotate: the trust engineer's functions -----------------------------


def _keygen(commands: argparse._SubParsersAction) -> None:
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
        _emit(args, {"keys": keys, "trust": str(result.trust_path)}, "\n".join(lines))
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))


def _sign(commands: argparse._SubParsersAction) -> None:
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
    _serials_argument(parser)
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
            targets=_targets(args),
            expires_in=timedelta(days=args.expires_days),
            deployment_id=args.deployment_id,
            min_agent_version=args.min_agent_version,
            trust_path=args.trust,
            serials=_serials(args),
            recipients=recipients,
            canary=None if args.canary is None else _canary(args.canary),
        )
        data = {"artifact": str(artifact), "release": str(envelope)}
        _emit(args, data, f"artifact {artifact}\nrelease  {envelope}")
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))


def _sign_agent(args: argparse.Namespace) -> int:
    """``hub sign --agent``: wheelhouses into a signed agent release (hub.agent_release)."""
    from edgeagent.fleet.agent_manifest import this_platform
    from edgeagent.hub.agent_release import sign_agent_release

    if args.encrypt or args.canary is not None:
        raise HubError("--encrypt and --canary are for model releases, not --agent")
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
        targets=_targets(args),
        expires_in=timedelta(days=args.expires_days),
        deployment_id=args.deployment_id,
        serials=_serials(args),
        trust_path=args.trust,
    )
    _emit(args, {"release": str(envelope)}, f"agent release {envelope}")
    return 0


def _canary(text: str) -> ReleaseCanary:
    """``--canary KEY=VALUE,...``; a bad value is a usage error naming the key and bounds."""
    try:
        return ReleaseCanary.from_option(text)
    except ValueError as exc:
        raise HubError(f"--canary: {exc}") from exc


def _rotate(commands: argparse._SubParsersAction) -> None:
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

    parser.set_defaults(handler=lambda args: _run(args, work))


# ---- serve / publish / rollout / status -------------------------------------------------


def _serve(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        formatter_class=DefaultsFormatter,
        help="serve artifacts over HTTP (Range, If-Range) for devices to download",
        description="Serve the files directly inside DIR until interrupted. Devices verify "
        "length and SHA-256 from the signed manifest, so any plain HTTP mirror would do too.",
    )
    parser.add_argument("directory", type=Path, metavar="DIR", help="the artifacts to serve")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="TCP port to listen on")
    parser.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", type=Path, help="the certificate's private key")

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.serve import serve_forever, server_tls

        if not args.directory.is_dir():
            raise HubError(f"{args.directory}: not a directory")
        try:
            tls = server_tls(args.tls_cert, args.tls_key)
        except (ValueError, OSError) as exc:
            raise HubError(f"--tls-cert/--tls-key: {exc}") from exc
        try:
            await serve_forever(args.directory, args.host, args.port, tls)
        except OSError as exc:
            raise HubError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from exc
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))


def trust_message(trust_file: Path) -> bytes:
    """What goes on the retained trust topic: every rotation archived beside ``trust_file``.

    A device walks trust versions one at a time, so one that slept through several rotations
    needs them all; a single file is sent only when no archive exists beside it (a trust file
    not made by ``hub rotate``).
    """
    try:
        return trust_chain(trust_file)
    except HubError:
        return trust_file.read_bytes()


def _publish(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "publish",
        formatter_class=DefaultsFormatter,
        help="publish a verified release to a device group (and/or single devices)",
        description="Publish RELEASE (a *.release.json from 'hub sign', or an "
        "*.agent-release.json from 'hub sign --agent') with QoS 1: retained on "
        "<prefix>/group/<GROUP>/release/<MODEL> (an agent release: .../release/_agent), and on "
        "<prefix>/device/<ID>/release for each "
        "--device. The release is verified first, against --trust (the trust file devices have) "
        "or --trust-file (published with it, before it), and refused when devices would refuse "
        "it. --trust-file without RELEASE publishes only the trust file. 'hub unpublish' clears "
        "a retained release.",
    )
    parser.add_argument(
        "release",
        type=Path,
        metavar="RELEASE",
        nargs="?",
        help="a *.release.json or *.agent-release.json",
    )
    parser.add_argument("--group", help="device group ([updates] group on the devices)")
    parser.add_argument("--device", action="append", default=[], help="a device id")
    parser.add_argument("--trust", type=Path, help="the trust file devices have: verify against it")
    parser.add_argument("--trust-file", type=Path, help="publish this rotated trust file too")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    _broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import publish, read_any_release, release_topics, slot_of
        from edgeagent.hub.verify import model_of

        settings = mqtt_settings(args)
        release = None
        if args.release is not None:
            trust = args.trust_file or args.trust
            if trust is None:
                raise HubError(
                    "say which trust file the devices verify against: --trust FILE "
                    "(or --trust-file FILE to publish it with the release)"
                )
            release = read_any_release(args.release, trust)
        elif args.trust_file is None:
            raise HubError("say which RELEASE to publish (a *.release.json from 'hub sign')")
        if args.trust_file is not None:
            if not args.group:
                raise HubError("--trust-file needs --group")
            topic = GroupTopics(settings.topic_prefix, args.group).trust
            await publish(settings, [topic], trust_message(args.trust_file))
            print(f"published {args.trust_file} to {topic}")
        if release is None:
            return 0
        envelope, manifest = release
        topics = release_topics(settings.topic_prefix, args.group, args.device, slot_of(manifest))
        await publish(settings, topics, envelope)
        names = [topic.name for topic in topics]
        data = {"deployment_id": manifest.deployment_id, "serial": manifest.serial, "topics": names}
        text = (
            f"published {model_of(manifest)} {manifest.version} serial {manifest.serial} "
            f"(deployment {manifest.deployment_id}) to {', '.join(names)}"
        )
        _emit(args, data, text)
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))


def _unpublish(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "unpublish",
        formatter_class=DefaultsFormatter,
        help="clear a model's retained release in a group",
        description="Delete the retained message on <prefix>/group/<GROUP>/release/<MODEL>, so "
        "devices that join later no longer receive that release. Devices that installed it keep "
        "serving it.",
    )
    parser.add_argument(
        "model", metavar="MODEL", help="the model whose release to clear (_agent: the agent's)"
    )
    parser.add_argument("--group", required=True, help="device group ([updates] group)")
    _broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import clear_release

        try:
            topic = await clear_release(mqtt_settings(args), args.group, args.model)
        except ValueError as exc:
            raise HubError(f"MODEL: {exc}") from exc
        print(f"cleared the retained release on {topic}")
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))


def _rollback(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "rollback",
        formatter_class=DefaultsFormatter,
        help="roll a group back to an older version of a model",
        description="Sign the release of MODEL --to VERSION kept in --artifacts again, with the "
        "model's next serial (so devices that committed a later version install it, while a "
        "replay of any earlier envelope stays refused), verify it against --trust and publish "
        "it retained to the group.",
    )
    parser.add_argument("model", metavar="MODEL", help="the model to roll back")
    parser.add_argument(
        "--to", required=True, dest="version", metavar="VERSION", help="the version to go back to"
    )
    parser.add_argument("--group", required=True, help="device group ([updates] group)")
    parser.add_argument(
        "--release-key",
        action="append",
        type=Path,
        required=True,
        dest="keys",
        help="release key that signs the rollback (repeat for a threshold)",
    )
    parser.add_argument(
        "--artifacts", type=Path, default=Path("."), help="where 'hub sign' wrote (--out)"
    )
    parser.add_argument("--trust", type=Path, required=True, help="the devices' trust file")
    parser.add_argument(
        "--expires-days", type=float, default=30.0, help="lifetime of the new release"
    )
    _serials_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    _broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import publish, release_topics
        from edgeagent.hub.sign import sign_rollback

        settings = mqtt_settings(args)
        manifest, envelope = sign_rollback(
            args.model,
            args.version,
            key_paths=args.keys,
            out_dir=args.artifacts,
            expires_in=timedelta(days=args.expires_days),
            trust_path=args.trust,
            serials=_serials(args),
        )
        # The group's retained slot: publish refuses a serial not above the one it holds.
        [topic] = release_topics(settings.topic_prefix, args.group, [], manifest.model)
        await publish(settings, [topic], envelope)
        data = {
            "deployment_id": manifest.deployment_id,
            "serial": manifest.serial,
            "topic": topic.name,
        }
        text = (
            f"rolled {args.group} back to {manifest.model} {manifest.version} with serial "
            f"{manifest.serial} (deployment {manifest.deployment_id}) on {topic}"
        )
        _emit(args, data, text)
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))


# The policy's REST field names (hub/policy/) as this command's flags, to name them in errors.
POLICY_FLAGS = {
    "stages_pct": "--stages",
    "abort_threshold_pct": "--abort-threshold",
    "min_executed": "--min-executed",
    "stage_timeout_s": "--stage-timeout",
}


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The staged policy's parameters as flags, with the policy's own defaults."""
    default = StagedPolicy()
    stages = ",".join(f"{p:g}" for p in default.stages_pct)
    parser.add_argument("--stages", default=stages, help="cumulative percentages")
    parser.add_argument(
        "--abort-threshold", type=float, default=default.abort_threshold_pct, help="percent failed"
    )
    parser.add_argument(
        "--min-executed",
        type=int,
        default=default.min_executed,
        help="outcomes needed before aborting can happen",
    )
    parser.add_argument(
        "--stage-timeout", type=float, default=default.stage_timeout_s, help="seconds per stage"
    )


def rollout_policy(args: argparse.Namespace) -> StagedPolicy:
    """The policy the flags describe; a bad value is a usage error naming its flag."""
    try:
        stages = [float(p) for p in args.stages.split(",")]
    except ValueError as exc:
        raise HubError(f"--stages {args.stages!r}: expected e.g. 5,25,100") from exc
    fields = {
        "stages_pct": stages,
        "abort_threshold_pct": args.abort_threshold,
        "min_executed": args.min_executed,
        "stage_timeout_s": args.stage_timeout,
    }
    try:
        return StagedPolicy.from_fields(fields)
    except PolicyError as exc:
        flag = POLICY_FLAGS.get(exc.field.partition("[")[0], exc.field)
        raise HubError(f"{flag}: {exc.problem}") from exc


def _rollout(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "rollout",
        formatter_class=DefaultsFormatter,
        help="staged rollout (5%% → 25%% → 100%%) with an abort threshold on failures",
        description="Send RELEASE to a growing share of GROUP's devices (those with a retained "
        "state report, or --device), waiting for each stage's outcomes. Each stage's envelope is "
        "signed anew with --release-key and targets exactly that stage's devices, so "
        "a device outside the stage refuses a replayed copy. Stops when at least "
        "--min-executed devices finished and --abort-threshold percent of them failed. "
        "Exit status 1 when the rollout was aborted.",
    )
    parser.add_argument(
        "release",
        type=Path,
        metavar="RELEASE",
        help="a *.release.json (with --server also a *.agent-release.json: the server relays it)",
    )
    parser.add_argument("--group", required=True, help="device group to roll out to")
    parser.add_argument("--device", action="append", help="roll out to these devices only")
    _policy_arguments(parser)
    parser.add_argument("--trust", type=Path, help="verify against this trust file first")
    parser.add_argument(
        "--release-key",
        action="append",
        type=Path,
        default=[],
        dest="keys",
        help="release key that signs each stage's envelope (repeat for a threshold; needed "
        "without --server, where the hub server sends the envelope as signed)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    _broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import read_release
        from edgeagent.hub.rollout import rollout
        from edgeagent.hub.sign import ManifestSigner

        if not args.keys:
            raise HubError("--release-key is required (it signs each stage's envelope)")
        policy = rollout_policy(args)
        _envelope, manifest = read_release(args.release, args.trust)
        say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
        signer = ManifestSigner(args.keys)
        report = await rollout(
            mqtt_settings(args),
            manifest,
            sign=signer,
            cancel=signer.cancellation,
            group=args.group,
            policy=policy,
            devices=args.device,
            progress=say,
        )
        data = report.to_dict()
        verdict = f"ABORTED: {report.reason}" if report.aborted else "completed"
        _emit(args, data, f"rollout {report.deployment_id} {verdict}")
        return EXIT_FAILED if report.aborted else 0

    parser.set_defaults(handler=lambda args: _run(args, work))


def _status(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "status",
        formatter_class=DefaultsFormatter,
        help="fleet table: online, models and versions, last update outcome per device",
        description="Read every device's retained state and availability from the broker "
        "(for --wait seconds) and print one line per device; --json for scripts.",
    )
    parser.add_argument("--group", help="only this group's devices")
    parser.add_argument("--wait", type=float, default=1.0, help="seconds to collect reports")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--recipients",
        type=Path,
        metavar="FILE",
        help="also write each reporting device's public key to FILE, for 'hub sign --encrypt'",
    )
    _broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.encrypt import write_recipients
        from edgeagent.hub.status import collect_fleet, format_table

        rows = await collect_fleet(mqtt_settings(args), group=args.group, wait_s=args.wait)
        if args.recipients is not None:
            write_recipients(args.recipients, {r["device_id"]: r["public_key"] for r in rows})
        _emit(args, rows, format_table(rows))
        return 0

    parser.set_defaults(handler=lambda args: _run(args, work))
