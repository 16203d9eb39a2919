"""The boot check: before every start, decide which version runs (``python -m`` this module).

It is run by ``<root>/boot-check`` with the *known-good* version's interpreter while a switch is
on trial (see ``layout.BOOT_SCRIPT``), before the new code runs, so a new version that crashes
at import, hangs before READY (the service manager kills it at its start timeout) or fails its
own confirmation is judged by code that works. Like RAUC's and Mender's boot counters:

* no pending switch: nothing to do;
* committed already (a crash after the commit record, before the pending record went): tidy;
* the switch never flipped ``current`` (the old agent died in the middle): roll it forward;
* the new version left a verdict, used up ``max_boots`` starts, or passed the deadline: roll
  back — the state paths its migration rewrote put back from the snapshot (``snapshot``), so
  the old version finds the state format it knows, ``current`` to the old version, the new one
  marked bad, an outcome left for the old agent to report — then let the start go on (into the
  old version);
* otherwise count this start and let the new version try.

A state snapshot with no switch on trial is a leftover of a decided one and is discarded. Each
decision is written before it is acted on, so a SIGKILL of this process at any point is
finished by the next run (``checkpoint``: ``agent_restored``, ``agent_rolled_back``). It
always exits 0 (an error is printed): failing ExecStartPre would keep *every* version from
starting.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from edgeagent.selfupdate import snapshot
from edgeagent.selfupdate.layout import Layout, LayoutError
from edgeagent.selfupdate.state import PendingSwitch, StateError, SwitchState

Checkpoint = Callable[[str], None]


def roll_back(
    layout: Layout,
    state: SwitchState,
    pending: PendingSwitch,
    reason: str,
    checkpoint: Checkpoint = lambda name: None,
) -> str:
    """Return to ``pending.from_version``; idempotent, so a crash half-way is finished later."""
    if not pending.verdict:
        pending = pending.failed(*_split(reason))
        state.write_pending(pending)  # decided: from here on every run finishes the rollback
    code, message = _split(pending.verdict)
    saved = snapshot.load(layout.root)
    saved = saved if saved is not None and saved.belongs_to(pending) else None
    restored = f"; state restored to format {saved.format}" if saved is not None else ""
    state.leave_outcome(
        pending.release,
        "failed",
        code,
        f"agent {pending.to_version} rolled back to {pending.from_version}: {message}{restored}",
    )
    state.mark_bad(pending.to_version)
    if saved is not None:
        snapshot.restore(layout.root, saved)
    checkpoint("agent_restored")
    if layout.current() != pending.from_version:
        layout.point(layout.current_link, pending.from_version)
    checkpoint("agent_rolled_back")
    state.clear_pending()
    snapshot.discard(layout.root)
    return f"rolled back to {pending.from_version}: {pending.verdict}{restored}"


def _split(verdict: str) -> tuple[str, str]:
    code, _, message = verdict.partition(": ")
    return code or "failed", message or verdict


def boot_check(
    root: Path, now: float | None = None, checkpoint: Checkpoint = lambda name: None
) -> str:
    """One decision (module docstring); returns what it did, for the journal."""
    layout, state = Layout(root), SwitchState(root)
    pending = state.pending()
    if pending is None:
        if snapshot.discard(layout.root):
            return "no switch pending; removed the state snapshot of a decided switch"
        return "no switch pending"
    record = state.record()
    if record.serial == pending.serial and record.version == pending.to_version:
        state.leave_outcome(
            pending.release, "succeeded", "committed", f"agent {pending.to_version} committed"
        )
        snapshot.discard(layout.root)
        state.clear_pending()
        return f"switch to {pending.to_version} was committed; tidied"
    moment = time.time() if now is None else now
    current = layout.current()

    def back(reason: str) -> str:
        return roll_back(layout, state, pending, reason, checkpoint)

    if pending.verdict:
        return back(pending.verdict)
    if current != pending.to_version:
        if pending.boots == 0 and current in (pending.from_version, None):
            layout.switch(pending.to_version)  # the old agent died between record and switch
            current = pending.to_version
        else:
            reason = f"current is {current}, the switch was to {pending.to_version}"
            return back(f"inconsistent: {reason}")
    if moment > pending.deadline:
        return back("deadline: not committed within the switch deadline")
    if pending.boots >= pending.max_boots:
        return back(
            f"no_commit: started {pending.boots} time(s) without reaching READY, passing its "
            "health check and committing (crash at start, hang before READY, or killed)"
        )
    state.write_pending(PendingSwitch(**{**pending.__dict__, "boots": pending.boots + 1}))
    return f"trying {pending.to_version}: start {pending.boots + 1} of {pending.max_boots}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m edgeagent.selfupdate.boot",
        description="Before the agent starts: count the start of a version on trial, or roll "
        "it back (ExecStartPre; exits 0 so a version always starts).",
    )
    parser.add_argument("--root", type=Path, required=True, help="the A/B install root")
    args = parser.parse_args(argv)
    try:
        print(f"edgeagent boot check: {boot_check(args.root)}", flush=True)
    except (StateError, LayoutError, OSError) as exc:
        print(f"edgeagent boot check: {exc}; starting current as it is", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
