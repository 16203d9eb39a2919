"""The state directory's format history: one forward migration per format, oldest first.

A format change of anything under ``[agent] state_dir`` (the model store, trust store, device
key, probe cache …) is one entry here and one test: a function that rewrites the state of
format ``n - 1`` into format ``n``, and the paths it may rewrite, create or delete (relative to
the state directory). ``stateformat`` runs the entries an older state needs, in order, at the
agent's start before anything reads the state, and writes the new format after each one.

While a self-update is on trial, exactly the ``touches`` paths are copied into the A/B root
first, and a rollback puts them back, so the previous version finds the format it knows. So:

* name every path the function may change (a directory is copied whole: keep them small);
* only read and write files, never import the code that owns them (that code moves on, a
  migration stays as it was written);
* cope with a path that is absent (a fresh or a partly used state directory);
* never delete a migration or change one that has shipped: a device may be any number of
  formats behind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Migration:
    format: int  # the format it produces, from ``format - 1``
    summary: str  # for the journal and the operator: what changes on disk
    touches: tuple[str, ...]  # paths under the state directory it may rewrite, create or delete
    apply: Callable[[Path], None]  # called with the state directory


def _declare(state_dir: Path) -> None:
    """Format 1 rewrites nothing: the state directory only starts declaring its format."""


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "the state directory declares its format (state-format.json)", (), _declare),
)
