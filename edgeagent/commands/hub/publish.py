"""``hub serve``, ``hub publish`` and ``hub unpublish``: artifacts over HTTP, releases and trust
files onto the broker.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import broker_arguments, emit, mqtt_settings, run
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hub.keys import HubError, trust_chain


def add_serve(commands: argparse._SubParsersAction) -> None:
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

    parser.set_defaults(handler=lambda args: run(args, work))


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


def add_publish(commands: argparse._SubParsersAction) -> None:
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
    broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import publish, read_any_release, release_topics, slot_of
        from edgeagent.hub.release_checks import model_of

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
        emit(args, data, text)
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))


def add_unpublish(commands: argparse._SubParsersAction) -> None:
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
    broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import clear_release

        try:
            topic = await clear_release(mqtt_settings(args), args.group, args.model)
        except ValueError as exc:
            raise HubError(f"MODEL: {exc}") from exc
        print(f"cleared the retained release on {topic}")
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))
