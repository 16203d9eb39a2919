"""``edgeagent hub export``: the samples of one model as a COCO, YOLO or ImageFolder dataset.

Reads the hub server's database and samples directory (the server may be running: SQLite is
in WAL mode, and the images are never rewritten).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import emit, run
from edgeagent.hub.keys import HubError
from edgeagent.paths import default_state_dir


def add_database_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="the hub server's database (default: hub.db in --state-dir)")
    parser.add_argument("--state-dir", type=Path, help="the hub server's state directory")
    parser.add_argument("--samples-dir", type=Path, help="its samples (default STATE_DIR/samples)")
    parser.add_argument("--model", required=True, help="whose samples")
    parser.add_argument("--version", help="of this version only (default: every version)")


async def load_rows(args: argparse.Namespace) -> tuple[list[dict], Path]:
    """Every sample row of ``--model`` (``--version``) and the directory of their images."""
    from edgeagent.hub.server import samples_db
    from edgeagent.hub.server.database import open_engine
    from edgeagent.hub.server.settings import default_database_url

    state_dir = args.state_dir or default_state_dir() / "hub"
    engine = open_engine(args.db or default_database_url(state_dir))
    try:
        async with engine.connect() as connection:
            rows = await samples_db.listing(
                connection, model=args.model, version=args.version, limit=10**9
            )
    finally:
        await engine.dispose()
    return rows, args.samples_dir or state_dir / "samples"


def add_export(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        formatter_class=DefaultsFormatter,
        help="a model's captured samples as a COCO, YOLO or ImageFolder dataset",
        description=(
            "Write the samples of --model as a dataset: COCO or YOLO for a detector's, "
            "ImageFolder for a classifier's; reviewed ones (accepted or corrected) unless "
            "--include-new. Reads the hub server's database and samples directory."
        ),
    )
    add_database_arguments(parser)
    parser.add_argument(
        "--format",
        required=True,
        choices=("coco", "yolo", "imagefolder"),
        dest="fmt",
        help="the dataset's layout",
    )
    parser.add_argument("--out", type=Path, required=True, help="a new directory")
    parser.add_argument(
        "--include-new",
        action="store_true",
        help="also samples nobody reviewed yet, labelled by the model's own answer",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")

    async def work(args: argparse.Namespace) -> int:
        from edgeagent.hub.datasets.export import ExportError, export, usable

        rows, blobs = await load_rows(args)
        chosen = usable(rows, args.include_new)
        if not chosen:
            raise HubError(f"no {'' if args.include_new else 'reviewed '}samples of {args.model}")
        try:
            summary = export(chosen, blobs, args.out, args.fmt)
        except ExportError as exc:
            raise HubError(str(exc)) from exc
        emit(args, summary, f"exported {summary['samples']} samples to {summary['path']}")
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))
