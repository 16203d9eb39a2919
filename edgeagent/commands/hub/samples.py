"""``edgeagent hub export``: the samples of one model as a COCO, YOLO or ImageFolder dataset.

Reads the hub server's database and its images — the samples directory, or the bucket of
``--samples-store`` (the server may be running: SQLite is in WAL mode, and the images are never
rewritten). The store flags are the server's own (``add_store_arguments``), so the same words
address the same images everywhere.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from edgeagent.commands.extras import missing_extra
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import emit, run
from edgeagent.hub.blobs import CONNECT_TIMEOUT_S, MAX_ATTEMPTS, READ_TIMEOUT_S, S3Settings
from edgeagent.hub.keys import HubError
from edgeagent.paths import default_state_dir

if TYPE_CHECKING:
    from edgeagent.hub.blobs import BlobStore


STORE_HELP = (
    "the images in an S3 bucket instead (credentials from the environment: "
    "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
)
S3_BOUNDS = (  # flag, S3Settings field, type, default, help
    ("--s3-connect-timeout", "connect_timeout_s", float, CONNECT_TIMEOUT_S, "seconds to connect"),
    ("--s3-read-timeout", "read_timeout_s", float, READ_TIMEOUT_S, "seconds to wait for answers"),
    ("--s3-max-attempts", "max_attempts", int, MAX_ATTEMPTS, "tries of one store call"),
)


def add_store_arguments(group: argparse._ActionsContainer) -> None:
    """Where the images are: ``--samples-dir`` or ``--samples-store`` and its connection."""
    group.add_argument("--samples-dir", type=Path, help="the images (default STATE_DIR/samples)")
    group.add_argument("--samples-store", metavar="s3://BUCKET/PREFIX", help=STORE_HELP)
    group.add_argument("--s3-endpoint", metavar="URL", help="an S3-compatible store (default AWS)")
    for flag, field, kind, default, what in S3_BOUNDS:
        metavar = "SECONDS" if kind is float else "N"
        group.add_argument(flag, dest=field, type=kind, default=default, metavar=metavar, help=what)


def store_settings(args: argparse.Namespace) -> S3Settings | None:
    """``--samples-store``'s settings (None: a directory); boto3 missing is an error here."""
    if args.samples_store is None:
        if args.s3_endpoint is not None:
            raise HubError("--s3-endpoint needs --samples-store s3://BUCKET/PREFIX")
        return None
    if args.samples_dir is not None:
        raise HubError("--samples-dir and --samples-store: give one place for images")
    missing = missing_extra("s3", "boto3")
    if missing is not None:
        raise HubError(missing)
    bounds = {field: getattr(args, field) for _, field, *_ in S3_BOUNDS}
    return S3Settings(url=args.samples_store, endpoint=args.s3_endpoint, **bounds)


def add_database_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="the hub server's database (default: hub.db in --state-dir)")
    parser.add_argument("--state-dir", type=Path, help="the hub server's state directory")
    add_store_arguments(parser)
    parser.add_argument("--model", required=True, help="whose samples")
    parser.add_argument("--version", help="of this version only (default: every version)")


async def load_rows(args: argparse.Namespace) -> tuple[list[dict], BlobStore]:
    """Every sample row of ``--model`` (``--version``) and the store of their images."""
    from edgeagent.hub.blobs import BlobError, open_store
    from edgeagent.hub.server import samples_db
    from edgeagent.hub.server.database import open_engine
    from edgeagent.hub.server.settings import default_database_url

    state_dir = args.state_dir or default_state_dir() / "hub"
    try:
        store = open_store(args.samples_dir or state_dir / "samples", store_settings(args))
        store.check()
    except BlobError as exc:
        raise HubError(str(exc)) from exc
    engine = open_engine(args.db or default_database_url(state_dir))
    try:
        async with engine.connect() as connection:
            rows = await samples_db.listing(
                connection, model=args.model, version=args.version, limit=10**9
            )
    finally:
        await engine.dispose()
    return rows, store


def add_export(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        formatter_class=DefaultsFormatter,
        help="a model's captured samples as a COCO, YOLO or ImageFolder dataset",
        description=(
            "Write the samples of --model as a dataset: COCO or YOLO for a detector's, "
            "ImageFolder for a classifier's; reviewed ones (accepted or corrected) unless "
            "--include-new. Reads the hub server's database and samples directory or bucket."
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
        from edgeagent.hub.blobs import BlobError
        from edgeagent.hub.datasets.export import ExportError, export, usable

        rows, blobs = await load_rows(args)
        chosen = usable(rows, args.include_new)
        if not chosen:
            raise HubError(f"no {'' if args.include_new else 'reviewed '}samples of {args.model}")
        try:
            summary = export(chosen, blobs, args.out, args.fmt)
        except (ExportError, BlobError) as exc:
            raise HubError(str(exc)) from exc
        emit(args, summary, f"exported {summary['samples']} samples to {summary['path']}")
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))
