"""What each state does to serving, expressed as the ServingLimits the engine enforces."""

from __future__ import annotations

from edgeagent.engine.limits import ServingLimits
from edgeagent.governor.policy import State
from edgeagent.governor.settings import GovernorSettings

SHED_ALL = 0  # priorities are >= 0, so this sheds every request
ACTIONS = ("batch_cap", "concurrency_cap", "pacing", "shedding", "downloads_paused", "low_power")


def effective_duty(
    settings: GovernorSettings, state: State, duty: float, power_save: bool
) -> float:
    """The controller's duty, lowered further by critical state and power-save mode."""
    if state == State.CRITICAL:
        return settings.min_duty
    if power_save:
        return min(duty, settings.power_save_duty)
    return duty


def serving_limits(
    settings: GovernorSettings,
    state: State,
    duty: float,
    power_save: bool,
    reason: str,
) -> ServingLimits:
    """The limits for one state and (effective) duty; power-save adds its own caps.

    The duty cycle reaches the engine as it is: the device gate paces each device's batches by
    the busy time they really took (``engine/gate.py``), so no estimate of a batch's length
    stands between the controller and the device's busy fraction.
    """
    batch_caps: list[int] = []
    concurrency: int | None = None
    if state == State.WARM:
        batch_caps.append(settings.warm_max_batch_size)
        concurrency = settings.warm_max_concurrency
    elif state >= State.HOT:
        batch_caps.append(settings.hot_max_batch_size)
        concurrency = settings.hot_max_concurrency
    if power_save:
        batch_caps.append(settings.power_save_max_batch_size)
    low_power_from = (
        None if settings.low_power_from == "never" else State[settings.low_power_from.upper()]
    )
    return ServingLimits(
        max_batch_size=min(batch_caps) if batch_caps else None,
        max_concurrency=concurrency,
        duty_cycle=round(min(1.0, duty), 6),
        shed_priority_from={State.HOT: settings.shed_priority_from, State.CRITICAL: SHED_ALL}.get(
            state
        ),
        retry_after_s=settings.retry_after_s,
        pause_downloads=state >= State.HOT or power_save,
        prefer_low_power=power_save or (low_power_from is not None and state >= low_power_from),
        reason=reason,
    )


def active_actions(limits: ServingLimits, duty: float) -> list[str]:
    """Names of the actions in force, for status, metrics and fleet reports."""
    on = {
        "batch_cap": limits.max_batch_size is not None,
        "concurrency_cap": limits.max_concurrency is not None,
        "pacing": duty < 1.0,
        "shedding": limits.shed_priority_from is not None,
        "downloads_paused": limits.pause_downloads,
        "low_power": limits.prefer_low_power,
    }
    return [name for name in ACTIONS if on[name]]
