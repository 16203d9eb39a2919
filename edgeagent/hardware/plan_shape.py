"""An execution plan's shape and how it is written: light (no numpy), so that the CLI's
``status`` can print a plan without loading what measures one (``plan_search``)."""

from __future__ import annotations

from dataclasses import dataclass

# The source of a plan served until its search ends: the configured shape (one instance of every
# core, the probe's own session), to be replaced by the searched plan.
PENDING = "pending"


@dataclass(frozen=True)
class PlanShape:
    """How one variant runs: ``instances`` sessions of ``threads`` intra-op threads each,
    merging up to ``batch`` rows per run."""

    instances: int
    threads: int
    batch: int

    @property
    def label(self) -> str:
        """``2x1:b4``: instances x threads, then the batch — the order of every text form
        (status, logs, ``edgeagent profile``, the benchmarks)."""
        return f"{self.instances}x{self.threads}:b{self.batch}"

    @property
    def text(self) -> str:
        """``2 instances x 1 thread, batch 4``: the label in words, in the label's order."""
        return (
            f"{self.instances} instance{'s' * (self.instances != 1)} x {self.threads} "
            f"thread{'s' * (self.threads != 1)}, batch {self.batch}"
        )
