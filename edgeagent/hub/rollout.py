"""``edgeagent hub rollout``: a rollout run in the foreground, over MQTT, under a rollout policy.

The rules (how many devices each stage reaches, its time-out, when to abort, what "done" means)
are the policy's (``hub/policy/``; the staged one by default: 5 % → 25 % → 100 %), and the hub
server's controller asks the same policy. This module only does the work: each stage's devices
get the release through their own release topic (QoS 1, persistent session, so an offline
device gets it when it returns), in an envelope signed with ``targets.device_ids`` set to that
stage's devices, so a copy replayed to a device outside the stage (say on the group topic) is
refused there as ``wrong_target``. Then it collects outcomes for this ``deployment_id`` until
the policy says the stage is over (a silent device counts as ``timed_out``); only events from
the rollout's own devices count, and malformed ones are skipped with a warning. Devices that
fail roll themselves back, so an aborted rollout leaves the fleet on the old version; a device
that timed out may still hold the release in its session (it was offline), so an abort sends
each of them a signed cancellation behind it (``fleet.cancel``), which makes it refuse the
release when it comes back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import aiomqtt

from edgeagent.fleet.cancel import Cancellation
from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.fleet.windows import MaintenanceWindow
from edgeagent.hub.keys import HubError
from edgeagent.hub.policy import SUCCEEDED, TIMED_OUT, RolloutPolicy, Tally, classify
from edgeagent.hub.publish import hub_client
from edgeagent.hub.status import collect_fleet, read_event

log = logging.getLogger(__name__)


@dataclass
class RolloutReport:
    deployment_id: str
    devices: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)  # device → succeeded/failed/…
    codes: dict[str, str] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    aborted: bool = False
    reason: str = ""
    cancelled: list[str] = field(default_factory=list)  # silent devices sent a cancellation

    @property
    def failed(self) -> list[str]:
        return [d for d, o in self.outcomes.items() if o != SUCCEEDED]

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "devices": self.devices,
            "outcomes": self.outcomes,
            "codes": self.codes,
            "stages": self.stages,
            "aborted": self.aborted,
            "cancelled": self.cancelled,
            "reason": self.reason,
            "succeeded": len(self.outcomes) - len(self.failed),
            "failed": len(self.failed),
        }


def stage_manifest(
    manifest: ReleaseManifest, wave: Sequence[str], window: MaintenanceWindow | None = None
) -> ReleaseManifest:
    """The release as one stage receives it: targeted at exactly that stage's devices, in the
    stage's own maintenance window if it has one (else the release's)."""
    targets = dataclasses.replace(manifest.targets, device_ids=tuple(wave))
    return dataclasses.replace(manifest, targets=targets, window=window or manifest.window)


async def rollout(
    settings: MqttSettings,
    manifest: ReleaseManifest,
    *,
    sign: Callable[[ReleaseManifest], bytes],
    cancel: Callable[[Cancellation], bytes] | None = None,
    group: str,
    policy: RolloutPolicy,
    devices: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda line: None,
    windows: Mapping[int, MaintenanceWindow] | None = None,
) -> RolloutReport:
    """Roll out to the devices of ``group`` (or the given ones) as ``policy`` says.

    ``sign`` turns each stage's manifest into its envelope (``hub.sign.ManifestSigner``), and
    ``cancel`` an abort's cancellation (``ManifestSigner.cancellation``). A release already
    limited to some device ids goes only to those of them in the group. ``windows`` gives
    stages (1-based) a maintenance window of their own (``fleet.windows``).
    """
    if devices is None:
        devices = [row["device_id"] for row in await collect_fleet(settings, group=group)]
    allowed = manifest.targets.device_ids
    devices = [d for d in devices if not allowed or d in allowed]
    if not devices:
        raise HubError(f"no devices in group {group!r} have reported yet; nothing to roll out to")
    report = RolloutReport(manifest.deployment_id, sorted(devices))
    prefix = settings.topic_prefix
    try:
        async with hub_client(settings, "rollout") as client:
            await client.subscribe(DeviceTopics(prefix).events.name, qos=1)
            done = 0
            sizes = policy.stage_sizes(len(report.devices))
            for number, size in enumerate(sizes, 1):
                wave = report.devices[done:size]
                done = size
                progress(f"stage {number}: {len(wave)} device(s) → {size}/{len(report.devices)}")
                window = (windows or {}).get(number)
                envelope = sign(stage_manifest(manifest, wave, window))
                for device in wave:
                    topic = DeviceTopics(prefix, device).release
                    await client.publish(topic.name, envelope, qos=1, retain=topic.retained)
                await _await_outcomes(client, prefix, report, wave, policy)
                tally = Tally.of(Counter(report.outcomes.values()))
                report.stages.append(
                    {
                        "stage": number,
                        "devices": wave,
                        "failed": tally.failed,
                        "failed_pct": tally.failed_pct,
                    }
                )
                progress(
                    f"stage {number}: {tally.finished - tally.failed} succeeded, "
                    f"{tally.failed} failed"
                )
                verdict = policy.verdict(number, len(sizes), tally)
                if verdict.state == "aborted":
                    report.aborted = True
                    report.reason = (
                        f"{verdict.reason}; {len(report.devices) - done} device(s) "
                        "did not receive the release"
                    )
                    if cancel is not None:
                        await _cancel_silent(client, prefix, manifest, cancel, report)
                    break
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc
    return report


async def _cancel_silent(
    client: aiomqtt.Client,
    prefix: str,
    manifest: ReleaseManifest,
    cancel: Callable[[Cancellation], bytes],
    report: RolloutReport,
) -> None:
    """Send the devices that never answered a cancellation of this release (every stage's
    envelope carries the manifest's serial), valid as long as the release."""
    silent = sorted(d for d, outcome in report.outcomes.items() if outcome == TIMED_OUT)
    now = datetime.now(timezone.utc).replace(microsecond=0)
    if not silent or manifest.expires <= now:
        return
    envelope = cancel(
        Cancellation(
            manifest.model,
            manifest.deployment_id,
            manifest.serial,
            now,
            manifest.expires,
            report.reason,
        )
    )
    for device in silent:
        await client.publish(DeviceTopics(prefix, device).release.name, envelope, qos=1)
    report.cancelled = silent


async def _await_outcomes(
    client: aiomqtt.Client,
    prefix: str,
    report: RolloutReport,
    wave: Sequence[str],
    policy: RolloutPolicy,
) -> None:
    waiting = set(wave)
    messages = aiter(client.messages)
    started = time.monotonic()
    while not policy.stage_over(len(waiting), started, now := time.monotonic()):
        try:
            message = await asyncio.wait_for(anext(messages), policy.deadline(started) - now)
        except asyncio.TimeoutError:
            break
        where = DeviceTopics.parse(prefix, message.topic.value)
        if where is None or where[1] != "events" or where[0] not in report.devices:
            continue  # only the rollout's own devices count, whatever others claim
        device = where[0]
        event = read_event(message.payload, f"event of {device}")
        outcome = event.outcome if event is not None else None
        if (
            device in waiting
            and outcome is not None
            and outcome.deployment_id == report.deployment_id
        ):
            waiting.discard(device)
            report.outcomes[device] = classify(outcome)
            report.codes[device] = outcome.code[:64]
    for device in waiting:
        report.outcomes[device] = TIMED_OUT
        report.codes[device] = TIMED_OUT
