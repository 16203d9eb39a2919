"""How a bench hands back its figures: one JSON report on stdout (what the smoke tests read),
and the same in ``--out FILE`` when asked (what the docs' tables are made from)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print only the JSON report")
    parser.add_argument("--out", type=Path, help="also write the figures here")


def report(figures: dict[str, Any], args: argparse.Namespace) -> int:
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0
