"""``hub rollout`` and ``hub rollback``: staged deployment to a group, and going back to a kept
older release.
"""

from __future__ import annotations

import argparse
import dataclasses
from datetime import timedelta
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import (
    EXIT_FAILED,
    broker_arguments,
    emit,
    mqtt_settings,
    release_serials,
    release_window,
    run,
    serials_argument,
    stage_windows,
    window_arguments,
)
from edgeagent.hub.keys import HubError
from edgeagent.hub.policy import PolicyError, StagedPolicy


def add_rollback(commands: argparse._SubParsersAction) -> None:
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
    serials_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    broker_arguments(parser)

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
            serials=release_serials(args),
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
        emit(args, data, text)
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))


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


def add_rollout(commands: argparse._SubParsersAction) -> None:
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
    window_arguments(parser, stages=True)
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    broker_arguments(parser)

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.publish import read_release
        from edgeagent.hub.rollout import rollout
        from edgeagent.hub.sign import ManifestSigner

        if not args.keys:
            raise HubError("--release-key is required (it signs each stage's envelope)")
        policy = rollout_policy(args)
        _envelope, manifest = read_release(args.release, args.trust)
        if args.window_timezone and not (args.window or args.stage_window):
            raise HubError("--window-timezone needs --window or --stage-window")
        if args.window:  # the whole rollout's, unless a stage has its own
            window = release_window(args.window, args.window_timezone)
            manifest = dataclasses.replace(manifest, window=window)
        windows = stage_windows(args)
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
            windows=windows,
        )
        data = report.to_dict()
        verdict = f"ABORTED: {report.reason}" if report.aborted else "completed"
        emit(args, data, f"rollout {report.deployment_id} {verdict}")
        return EXIT_FAILED if report.aborted else 0

    parser.set_defaults(handler=lambda args: run(args, work))
