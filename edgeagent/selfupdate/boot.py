"""The boot check: before every start, decide which version runs (``python -m`` this module).

It is run by ``<root>/boot-check`` with the *known-good* version's interpreter while a switch is
on trial (see ``layout.BOOT_SCRIPT``), before the new code runs, so a new version that crashes
at import, hangs before READY (the service manager kills it at its start timeout) or fails its
own confirmation is judged by code that works. Like RAUC's and Mender's boot counters:

* no pending switch: nothing to do;
* committed already (a crash after the commit record, before the pending record went): tidy;
* the switch never flipped ``current`` (the old agent died in the middle): roll it forward;
* the new version left a verdict, used up ``max_boots`` starts, or passed the deadline: roll
  back — ``current`` to the old version, the new one marked bad, an outcome left for the old
  agent to report — then let the start go on (into the old version);
* otherwise count this start and let the new version try.

Each decision is written before it is acted on, so a SIGKILL of this process at any point is
finished by the next run. It always exits 0 (an error is printed): failing ExecStartPre would
keep *every* version from starting.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from edgeagent.selfupdate.layout import Layout, LayoutError
from edgeagent.selfupdate.state import PendingSwitch, StateError, SwitchState


def roll_back(layout: Layout, state: SwitchState, pending: PendingSwitch, reason: str) -> str:
    """Return to ``pending.from_version``; idempotent, so a crash half-way is finished later."""
    if not pending.verdict:
        pending = pending.failed(*_split(reason))
        state.write_pending(pending)  # decided: from here on every run finishes the rollback
    code, message = _split(pending.verdict)
    state.leave_outcome(
        pending.release,
        "failed",
        code,
        f"agent {pending.to_version} rolled back to {pending.from_version}: {message}",
    )
    state.mark_bad(pending.to_version)
    if layout.current() != pending.from_version:
        layout.point(layout.current_link, pending.from_version)
    state.clear_pending()
    return f"rolled back to {pending.from_version}: {pending.verdict}"


def _split(verdict: str) -> tuple[str, str]:
    code, _, message = verdict.partition(": ")
    return code or "failed", message or verdict


def boot_check(root: Path, now: float | None = None) -> str:
    """One decision (module docstring); returns what it did, for the journal."""
    layout, state = Layout(root), SwitchState(root)
    pending = state.pending()
    if pending is None:
        return "no switch pending"
    record = state.record()
    if record.serial == pending.serial and record.version == pending.to_version:
        state.leave_outcome(
            pending.release, "succeeded", "committed", f"agent {pending.to_version} committed"
        )
        state.clear_pending()
        return f"switch to {pending.to_version} was committed; tidied"
    moment = time.time() if now is None else now
    current = layout.current()
    if pending.verdict:
        return roll_back(layout, state, pending, pending.verdict)
    if current != pending.to_version:
        if pending.boots == 0 and current in (pending.from_version, None):
            layout.switch(pending.to_version)  # the old agent died between record and switch
            current = pending.to_version
        else:
            reason = f"current is {current}, the switch was to {pending.to_version}"
            return roll_back(layout, state, pending, f"inconsistent: {reason}")
    if moment > pending.deadline:
        return roll_back(
            layout, state, pending, "deadline: not committed within the switch deadline"
        )
    if pending.boots >= pending.max_boots:
        return roll_back(
            layout,
            state,
            pending,
            f"no_commit: started {pending.boots} time(s) without reaching READY, passing its "
            "health check and committing (crash at start, hang before READY, or killed)",
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
