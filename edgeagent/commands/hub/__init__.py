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
    export               a model's captured samples as a COCO, YOLO or ImageFolder dataset
    train                fine-tune a classifier on its reviewed samples, package, sign a canary

Every command exits 0 on success, 2 on a usage or input error (a bad key, package or release
file, an unreachable or malformed --broker), 1 when the work itself failed (a rollout aborted),
and prints a one-line reason on standard error.
"""

from __future__ import annotations

import argparse

from edgeagent.commands.hub import keys, publish, rollout, samples, sign, status, train
from edgeagent.commands.hub.common import (
    EXIT_USAGE,
    broker_arguments,
    emit,
    mqtt_settings,
    run,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "hub",
        help="fleet manager: keys, signing, publishing, artifact server, rollouts, fleet status",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="hub_command", metavar="HUB_COMMAND")
    keys.add_keygen(commands)
    sign.add_sign(commands)
    publish.add_serve(commands)
    publish.add_publish(commands)
    publish.add_unpublish(commands)
    rollout.add_rollback(commands)
    rollout.add_rollout(commands)
    status.add_status(commands)
    keys.add_rotate(commands)
    samples.add_export(commands)
    train.add_train(commands)
    # ---- hub server, and --server for status / rollout (edgeagent/commands/hub_server.py) ----
    from edgeagent.commands import hub_server

    hub_server.register(
        commands,
        broker_arguments=broker_arguments,
        mqtt_settings=mqtt_settings,
        run=run,
        emit=emit,
    )
    # ------------------------------------------------------------------------------------------
    parser.set_defaults(handler=lambda args: _usage(parser))


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return EXIT_USAGE
