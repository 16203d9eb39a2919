"""``edgeagent hub rollout``: a staged deployment with an abort criterion (AWS IoT Jobs' terms).

The release goes to a growing share of the group's devices — by default 5 % → 25 % →
100 % (each stage cumulative, at least one device) — through each device's own release topic
(QoS 1, persistent session, so an offline device gets it when it returns). Each stage gets its
own envelope, signed with ``targets.device_ids`` set to that stage's devices, so a copy replayed
to a device outside the stage (say on the group topic) is refused there as ``wrong_target``.
After each stage the hub waits until every device of the stage reported an outcome for this
``deployment_id``, or the stage's *in-progress time-out* expires (a silent device counts as
``timed_out``); only events from the rollout's own devices count, and malformed ones are
skipped with a warning. Then the *abort criteria*: once at least ``min_executed`` devices
finished, if the failed share (failed, refused for any reason but "already at this version",
timed out) reaches ``abort_threshold_pct``, the rollout stops and no further device receives
the release. Devices that fail roll themselves back, so an aborted rollout leaves the fleet
on the old version.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiomqtt

from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.hub.keys import HubError
from edgeagent.hub.publish import hub_client
from edgeagent.hub.status import collect_fleet, read_report

log = logging.getLogger(__name__)

# A refusal that means the device already has what we are rolling out: a success.
ALREADY_DONE = {"same_version"}


@dataclass(frozen=True)
class RolloutPlan:
    stages_pct: tuple[float, ...] = (5.0, 25.0, 100.0)
    abort_threshold_pct: float = 20.0  # failed share of finished devices that stops the rollout
    min_executed: int = 1  # finished devices needed before the abort criterion applies
    stage_timeout_s: float = 600.0  # in-progress time-out per stage

    def validate(self) -> None:
        stages = self.stages_pct
        if not stages or any(not 0 < p <= 100 for p in stages) or list(stages) != sorted(stages):
            raise HubError("--stages must be increasing percentages in (0, 100], e.g. 5,25,100")
        if stages[-1] != 100:
            raise HubError("the last stage must be 100 (every device), e.g. 5,25,100")
        if not 0 < self.abort_threshold_pct <= 100:
            raise HubError("--abort-threshold must be a percentage in (0, 100]")


@dataclass
class RolloutReport:
    deployment_id: str
    devices: list[str]
    outcomes: dict[str, str] = field(default_factory=dict)  # device → succeeded/failed/…
    codes: dict[str, str] = field(default_factory=dict)
    stages: list[dict[str, Any]] = field(default_factory=list)
    aborted: bool = False
    reason: str = ""

    @property
    def failed(self) -> list[str]:
        return [d for d, o in self.outcomes.items() if o != "succeeded"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment_id": self.deployment_id,
            "devices": self.devices,
            "outcomes": self.outcomes,
            "codes": self.codes,
            "stages": self.stages,
            "aborted": self.aborted,
            "reason": self.reason,
            "succeeded": len(self.outcomes) - len(self.failed),
            "failed": len(self.failed),
        }


def stage_sizes(total: int, stages_pct: Sequence[float]) -> list[int]:
    """Cumulative device counts per stage: at least one device, never more than the fleet."""
    sizes: list[int] = []
    for pct in stages_pct:
        size = min(total, max(1, math.ceil(total * pct / 100)))
        if not sizes or size > sizes[-1]:
            sizes.append(size)
    return sizes


def stage_manifest(manifest: ReleaseManifest, wave: Sequence[str]) -> ReleaseManifest:
    """The release as one stage receives it: targeted at exactly that stage's devices."""
    targets = dataclasses.replace(manifest.targets, device_ids=tuple(wave))
    return dataclasses.replace(manifest, targets=targets)


def classify(event: dict[str, Any]) -> str:
    result = event.get("result", "")
    if result == "refused" and event.get("code") in ALREADY_DONE:
        return "succeeded"
    return "succeeded" if result == "succeeded" else "failed"


async def rollout(
    settings: MqttSettings,
    manifest: ReleaseManifest,
    *,
    sign: Callable[[ReleaseManifest], bytes],
    group: str,
    plan: RolloutPlan,
    devices: Sequence[str] | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> RolloutReport:
    """Run the staged rollout to the devices of ``group`` (or the given ones).

    ``sign`` turns each stage's manifest into its envelope (``hub.sign.ManifestSigner``). A
    release already limited to some device ids goes only to those of them in the group.
    """
    plan.validate()
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
            for number, size in enumerate(stage_sizes(len(report.devices), plan.stages_pct), 1):
                wave = report.devices[done:size]
                done = size
                progress(f"stage {number}: {len(wave)} device(s) → {size}/{len(report.devices)}")
                envelope = sign(stage_manifest(manifest, wave))
                for device in wave:
                    topic = DeviceTopics(prefix, device).release
                    await client.publish(topic.name, envelope, qos=1, retain=topic.retained)
                await _await_outcomes(client, prefix, report, wave, plan.stage_timeout_s)
                finished = len(report.outcomes)
                failed = len(report.failed)
                share = 100.0 * failed / finished if finished else 0.0
                report.stages.append(
                    {"stage": number, "devices": wave, "failed": failed, "failed_pct": share}
                )
                progress(f"stage {number}: {finished - failed} succeeded, {failed} failed")
                if finished >= plan.min_executed and failed and share >= plan.abort_threshold_pct:
                    report.aborted = True
                    report.reason = (
                        f"{failed} of {finished} devices failed ({share:.0f} % ≥ abort threshold "
                        f"{plan.abort_threshold_pct:g} %); {len(report.devices) - done} device(s) "
                        "did not receive the release"
                    )
                    break
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc
    return report


async def _await_outcomes(
    client: aiomqtt.Client,
    prefix: str,
    report: RolloutReport,
    wave: Sequence[str],
    timeout_s: float,
) -> None:
    waiting = set(wave)
    messages = aiter(client.messages)
    deadline = time.monotonic() + timeout_s
    while waiting and (left := deadline - time.monotonic()) > 0:
        try:
            message = await asyncio.wait_for(anext(messages), left)
        except asyncio.TimeoutError:
            break
        where = DeviceTopics.parse(prefix, message.topic.value)
        if where is None or where[1] != "events" or where[0] not in report.devices:
            continue  # only the rollout's own devices count, whatever others claim
        device = where[0]
        event = read_report(message.payload, f"event of {device}")
        if (
            device in waiting
            and event is not None
            and event.get("deployment_id") == report.deployment_id
            and event.get("step") == "done"
        ):
            waiting.discard(device)
            report.outcomes[device] = classify(event)
            report.codes[device] = str(event.get("code", ""))[:64]
    for device in waiting:
        report.outcomes[device] = "timed_out"
        report.codes[device] = "timed_out"
