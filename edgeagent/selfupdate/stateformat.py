"""The state directory declares its format, and an agent moves an older one forwards at start.

``<state_dir>/state-format.json`` is ``{"format": 2, "written_by": "0.7.0"}``: the format of
everything under the state directory (``migrations`` lists them) and the agent that wrote it.
A state directory without it is format 0 (written before formats were declared).

* ``plan`` — what this agent would do with a state directory: nothing, migrate it (the steps),
  or refuse it, when its format is newer than this agent knows (``state_refused``). The new
  version's ``agent-update check-state`` runs it before a switch, next to its ``config check``,
  so a version that cannot read the state is refused with the old one untouched.
* ``prepare_state`` — the daemon's first act, before anything reads the state. While a switch
  to this version is on trial it first saves exactly the paths the migrations touch into the A/B
  root (``snapshot``), so the boot check's rollback can hand the old version the format it
  knows; each step is recorded before it is acted on:

  1. the snapshot appears complete in one rename (``agent_snapshotted``);
  2. each migration runs, then the format it reached is written (``agent_migrated`` after all);
  3. a start that finds its snapshot but not the final format was cut short in step 2: it puts
     the saved paths back and migrates again, so a migration never resumes a half-done rewrite.

  A refusal on trial writes the switch's verdict, so the boot check rolls back at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgeagent import __version__
from edgeagent.fsutil import NotARegularFile, read_regular_file, write_json_atomic
from edgeagent.selfupdate import snapshot
from edgeagent.selfupdate.layout import Layout
from edgeagent.selfupdate.migrations import MIGRATIONS, Migration
from edgeagent.selfupdate.state import PendingSwitch, StateError, SwitchState

FORMAT_FILE = "state-format.json"
FORMAT_FILE_MAX_BYTES = 64 * 1024  # the file is ~50 bytes; anything near this is not ours
REFUSED = "state_refused"

log = logging.getLogger(__name__)


class StateFormatError(RuntimeError):
    """This agent cannot take the state directory as it is (the message says why)."""

    code = REFUSED


@dataclass(frozen=True)
class Declared:
    format: int
    written_by: str | None  # None: no format file


@dataclass(frozen=True)
class Plan:
    state_dir: Path
    found: Declared
    steps: tuple[Migration, ...]
    version: str  # of the agent that plans

    @property
    def touches(self) -> tuple[str, ...]:
        """What a rollback must put back: the steps' paths, and the format file for an old
        agent that reads one (it would refuse a format newer than its own)."""
        paths = [p for step in self.steps for p in step.touches]
        if self.steps and self.found.format > 0:
            paths.append(FORMAT_FILE)
        return tuple(dict.fromkeys(paths))

    def describe(self) -> str:
        writer = self.found.written_by or "an agent before state formats"
        head = f"{self.state_dir}: state format {self.found.format} (written by {writer})"
        if not self.steps:
            return f"{head}: agent {self.version} reads it as it is"
        summary = "; ".join(f"{s.format}: {s.summary}" for s in self.steps)
        newest = self.steps[-1].format
        return f"{head}: agent {self.version} migrates it to format {newest} ({summary})"

    def check_restorable(self) -> None:
        """A snapshot is restored by the *old* version's boot check, which knows snapshots only
        if it declared a format itself: from format 0, only migrations that rewrite nothing."""
        if self.touches and self.found.format == 0:
            raise StateFormatError(
                f"{self.state_dir} has no {FORMAT_FILE}: the agent that wrote it predates state "
                f"formats and could not restore {', '.join(self.touches)} at a rollback; update "
                "to an agent that declares state formats first"
            )


def read_declared(state_dir: Path) -> Declared:
    """The format ``state_dir`` declares; StateFormatError when its file cannot be trusted.

    The file is read as a bounded regular file (``read_regular_file``: no link followed, no
    FIFO waited on) and parsed with nesting errors caught: ``run`` and ``check-state``, which
    the update worker waits on, read it first, so any content must end in an answer.
    """
    path = Path(state_dir) / FORMAT_FILE
    try:
        data = json.loads(read_regular_file(path, FORMAT_FILE_MAX_BYTES).decode("utf-8"))
    except FileNotFoundError:
        return Declared(0, None)
    except NotARegularFile as exc:
        raise StateFormatError(f"{exc}; remove it, or restore it from a backup") from exc
    except (OSError, ValueError, RecursionError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        if isinstance(exc, RecursionError):
            why = "nested too deeply"
        raise StateFormatError(f"{path}: unreadable ({why}); restore it from a backup") from exc
    number = data.get("format") if isinstance(data, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        raise StateFormatError(f"{path}: 'format' must be an integer >= 1")
    writer = data.get("written_by")
    return Declared(number, writer if isinstance(writer, str) else None)


def plan(
    state_dir: Path, *, version: str = __version__, migrations: tuple[Migration, ...] = MIGRATIONS
) -> Plan:
    """What this agent would do with ``state_dir``; StateFormatError when it is too new."""
    found = read_declared(state_dir)
    newest = migrations[-1].format
    if found.format > newest:
        raise StateFormatError(
            f"{state_dir} is in state format {found.format} (written by agent "
            f"{found.written_by}); agent {version} reads formats up to {newest}: run a newer "
            "agent, or restore the state directory of this one"
        )
    steps = tuple(m for m in migrations if m.format > found.format)
    return Plan(Path(state_dir), found, steps, version)


def migrate(plan: Plan) -> None:
    """Run the plan's steps in order, writing the format reached after each one."""
    plan.state_dir.mkdir(parents=True, exist_ok=True)
    for step in plan.steps:
        step.apply(plan.state_dir)
        document = {"format": step.format, "written_by": plan.version}
        write_json_atomic(plan.state_dir / FORMAT_FILE, document)
        # A step that rewrites nothing (format 1 adds the file) happens at every first start.
        level = logging.INFO if step.touches else logging.DEBUG
        log.log(level, "state %s migrated to format %d: %s", plan.state_dir, step.format,
                step.summary)  # fmt: skip


def _on_trial(root: Path, version: str) -> tuple[SwitchState, PendingSwitch] | None:
    """The switch to ``version`` that this start is trying, if any."""
    state = SwitchState(root)
    pending = state.pending()
    if pending is None or pending.verdict or pending.to_version != version:
        return None
    return (state, pending) if Layout(root).current() == version else None


def prepare_state(
    state_dir: Path,
    root: Path | None,
    *,
    version: str = __version__,
    migrations: tuple[Migration, ...] = MIGRATIONS,
    checkpoint: Callable[[str], None] = lambda name: None,
) -> str:
    """Bring ``state_dir`` to this agent's format before anything reads it (module docstring);
    ``root`` is ``[updates] agent_root`` (None: no self-updates). Returns what it did."""
    trial = _on_trial(root, version) if root is not None else None
    if trial is None:
        todo = plan(state_dir, version=version, migrations=migrations)
        migrate(todo)
        return todo.describe()
    assert root is not None
    state, pending = trial
    try:
        return _prepare_on_trial(state_dir, root, pending, version, migrations, checkpoint)
    except StateFormatError as exc:
        state.write_pending(pending.failed(exc.code, str(exc)))  # the boot check rolls back
        raise


def _prepare_on_trial(
    state_dir: Path,
    root: Path,
    pending: PendingSwitch,
    version: str,
    migrations: tuple[Migration, ...],
    checkpoint: Callable[[str], None],
) -> str:
    saved = snapshot.load(root)
    if saved is not None and not saved.belongs_to(pending):
        snapshot.discard(root)  # another switch's leftover
        saved = None
    if saved is not None:
        if read_declared(state_dir).format == migrations[-1].format:
            return f"{state_dir}: migrated at an earlier start of agent {version}"
        snapshot.restore(root, saved)  # cut short: start again from the saved paths
        log.warning("state %s: a migration was cut short; starting it again", state_dir)
    todo = plan(state_dir, version=version, migrations=migrations)
    todo.check_restorable()
    if not todo.touches:
        migrate(todo)
        return todo.describe()
    if saved is None:
        try:
            snapshot.take(root, pending, state_dir, todo.found.format, todo.touches)
        except StateError as exc:  # e.g. a linked directory: refused, so the switch rolls back
            raise StateFormatError(str(exc)) from exc
        checkpoint("agent_snapshotted")
    migrate(todo)
    checkpoint("agent_migrated")
    return f"{todo.describe()}; {', '.join(todo.touches)} saved for a rollback"
