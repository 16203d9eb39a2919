#!/usr/bin/env python3
"""Fuzz a real agent from its own OpenAPI document (schemathesis), with many more examples than
the test suite: every operation, valid and invalid requests, over loopback TCP with the token.

    scripts/fuzz_api.py --examples 200        # per operation and mode
    scripts/fuzz_api.py --examples 50 --random  # a different draw each run

Prints the requests sent, the statuses answered, and every server error (5xx other than 503
with Retry-After and 504); exits 1 if there was one or the daemon died.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.agent_process import running_daemon  # noqa: E402
from devtools.api_fuzz import FuzzReport, fuzz_operation, operations  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200, help="per operation and mode")
    parser.add_argument("--random", action="store_true", help="not the same draw every run")
    args = parser.parse_args()
    report = FuzzReport()
    started = time.monotonic()
    with (
        tempfile.TemporaryDirectory(prefix="edgeagent-fuzz-") as root,
        running_daemon(Path(root)) as daemon,
    ):
        for operation in operations():
            before = report.examples
            fuzz_operation(
                operation, daemon.url, daemon.headers, args.examples, report, not args.random
            )
            print(f"{operation.label}: {report.examples - before} requests", flush=True)
        alive = daemon.alive()
    elapsed = time.monotonic() - started
    statuses = ", ".join(f"{code}: {n}" for code, n in sorted(report.statuses.items()))
    print(f"\n{report.examples} requests in {elapsed:.0f} s; statuses {statuses}")
    print(f"server errors: {len(report.server_errors)}; daemon alive at the end: {alive}")
    for line in report.server_errors:
        print("  " + line)
    return 0 if alive and not report.server_errors else 1


if __name__ == "__main__":
    sys.exit(main())
