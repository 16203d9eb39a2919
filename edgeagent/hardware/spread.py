"""One model on several devices at once: which devices, and which candidate on each.

``[hardware] spread`` (or model.toml ``[serving] spread``) asks for instances on up to N
distinct devices, or on the devices named. A *device* is the hardware a candidate runs on, not
its runtime: onnxruntime's ``CPUExecutionProvider`` and OpenVINO's ``CPU`` are one CPU, CUDA and
TensorRT on device 0 are one GPU, a TensorRT candidate with DLA enabled runs on that DLA core.
Each device serves with its best working candidate in the profile's ranking — the chooser's
pick for its own device, the next devices probed here in rank order — and fails over first
within its device, then to candidates on devices outside the group: a device that is gone
entirely leaves the group's rotation (the others serve on) instead of doubling up on one of
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edgeagent.hardware.choose import Choice, Option, is_cpu
from edgeagent.hardware.probe import ProbeResult
from edgeagent.hardware.profile import Candidate
from edgeagent.runtimes import Session

GPU_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


def device_key(candidate: Candidate) -> str:
    """The physical device ``candidate`` runs on: CPU, GPU0, DLA1, NPU, EDGETPU:usb, SIM0 …"""
    if is_cpu(candidate):
        return "CPU"
    options = candidate.options
    if candidate.device in GPU_PROVIDERS:
        if options.get("trt_dla_enable"):
            return f"DLA{options.get('trt_dla_core', 0)}"
        return f"GPU{options.get('device_id', 0)}"
    where = options.get("device")
    return f"{candidate.device}:{where}" if where else candidate.device


def wanted_devices(spread: int | Sequence[str]) -> tuple[int, tuple[str, ...] | None]:
    """(how many devices at most, the devices allowed or None for any) of a spread value."""
    if isinstance(spread, int):
        return spread, None
    return len(spread), tuple(spread)


def pick_devices(
    choice: Choice,
    spread: int | Sequence[str],
    load: Callable[[Option], tuple[Session | None, ProbeResult]],
) -> list[tuple[Option, Session]]:
    """The best working candidate of each device, in ranking order, up to ``spread`` devices.

    The chooser's pick keeps its session; the other devices' candidates are loaded (probed)
    with ``load`` (their results join the choice's) only until each wanted device has one
    that works. With a list, only the devices named take part, and the chooser's pick serves
    only if its device is one of them (its session is closed otherwise). Empty when no wanted
    device works.
    """
    count, allowed = wanted_devices(spread)
    picked: list[tuple[Option, Session]] = []
    taken: set[str] = set()
    for option in choice.fallback_order():  # the chooser's pick first, then by rank
        device = device_key(option.candidate)
        if device in taken or (allowed is not None and device not in allowed):
            continue
        if len(taken) >= count:
            break
        if option is choice.chosen and choice.session is not None:
            session: Session | None = choice.session
        else:
            session, choice.results[option.key] = load(option)
        if session is not None:
            picked.append((option, session))
            taken.add(device)
    unused = choice.session is not None and all(s is not choice.session for _, s in picked)
    if unused and choice.session is not None:  # the chooser's pick is on no device named
        choice.session.close()
    return sorted(picked, key=lambda pair: pair[0].rank)


def lane_order(order: Sequence[Option], picked: Option, group: set[str]) -> list[Option]:
    """One device's failover order: its pick, its device's other candidates, then those on no
    device of the group (in ``order``'s ranking)."""
    device = device_key(picked.candidate)
    own = [o for o in order if device_key(o.candidate) == device and o.key != picked.key]
    outside = [o for o in order if device_key(o.candidate) not in group]
    return [picked, *own, *outside]
