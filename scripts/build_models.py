#!/usr/bin/env python3
"""Build the model zoo: one package per model in ``OUT/<name>/`` (see edgeagent/models/package.py).

Run from the build venv (torch, litert-torch, onnx; never a runtime dependency):

    .venv-build/bin/python scripts/build_models.py --out zoo [--only NAME] [--json]

Offline and reproducible: the same seed gives the same model outputs. A package whose stored
build key (hash of these sources, seed, formats and tool versions) matches is skipped, so the
set-up command costs seconds the second time. Progress goes to stderr, the summary to stderr
(or to stdout as JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

TOOLS = (
    "torch",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "litert-torch",
    "ai-edge-litert",
    "openvino",
    "scikit-learn",
    "numpy",
    "pillow",
)
KEY_FILE = "build.json"
DECODER_SOURCES = (
    "detector.py",
    "detection_head.py",
    "tasks/decode.py",
    "tasks/detection.py",
    "tasks/detection_map.py",
    "tasks/boxes.py",
)
SAMPLES = "samples"


def build_key(name: str, seed: int, formats: tuple[str, ...]) -> str:
    """Everything that changes a package's outputs: sources, seed, formats, tool versions."""
    digest = hashlib.sha256(f"{name}|{seed}|{','.join(formats)}".encode())
    sources = sorted(p for p in (HERE / "modelbuild").iterdir() if p.suffix in (".py", ".tsv"))
    sources += [REPO / "edgeagent" / "packaging" / f for f in ("quantize.py", "torch_export.py")]
    sources.append(REPO / "edgeagent" / "hub" / "train" / "grid_targets.py")  # the detector's GIoU
    # the detector's figures and golden boxes come from the agent's own decoder
    sources += [REPO / "edgeagent" / "models" / f for f in DECODER_SOURCES]
    for source in [Path(__file__).resolve(), *sources]:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    for tool in TOOLS:
        try:
            digest.update(f"{tool}=={metadata.version(tool)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{tool} missing".encode())
    return digest.hexdigest()


def is_current(directory: Path, key: str) -> bool:
    """The package was built with this key and still validates (files present, hashes match)."""
    try:
        stored = json.loads((directory / KEY_FILE).read_text())
    except (OSError, ValueError):
        return False
    if stored.get("key") != key:
        return False
    if directory.name == SAMPLES:
        return all((directory / f).is_file() for f in stored.get("files", {}))
    from edgeagent.models.package import PackageError, load_package

    try:
        load_package(directory)
    except PackageError:
        return False
    return True


def replace_dir(staged: Path, final: Path) -> None:
    """Swap a fully written directory into place so an interrupted build never leaves half a
    package where the agent or the tests would read it."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        final.rename(old)
    staged.rename(final)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def exclusive(out: Path):
    """One build per zoo directory at a time: a second one waits instead of deleting the
    first one's staging directories or swapping packages under it."""
    with (out / ".build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _progress("zoo")(f"waiting for another build of {out} to finish")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def stdout_to_stderr():
    """Converters print to file descriptor 1 from C++; keep stdout clean for ``--json``."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield os.fdopen(os.dup(saved), "w")
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def setup_worker() -> None:
    """Per build process: one intra-op thread and deterministic kernels.

    On a small shared CPU, OpenMP threads spinning against other processes made training 6×
    slower; and single-threaded float reductions give the same results on machines with any
    core count, which is what makes the outputs reproducible. Parallelism comes from building
    packages in separate processes instead.
    """
    import torch

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def build_one(out: Path, name: str, key: str, seed: int, formats: tuple[str, ...]) -> dict:
    """Stage, build, verify and swap in one directory (in a worker process); returns the
    summary entry."""
    from modelbuild.builder import build_package
    from modelbuild.detector_builder import build_detector
    from modelbuild.sample_images import write_samples
    from modelbuild.specs import SPECS

    progress = _progress(name)
    progress("building")
    staged = out / f".{name}.partial"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    started = time.perf_counter()
    try:
        if name == SAMPLES:
            report = write_samples(staged, seed)
        else:
            spec = SPECS[name]
            build = build_detector if spec.task == "detection" else build_package
            report = build(spec, staged, seed, formats, progress)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    seconds = round(time.perf_counter() - started, 1)
    files = {p.name: p.stat().st_size for p in sorted(staged.iterdir()) if p.is_file()}
    (staged / KEY_FILE).write_text(
        json.dumps({"key": key, "seconds": seconds, "files": files}, indent=2) + "\n"
    )
    if name != SAMPLES:
        from edgeagent.models.package import load_package

        load_package(staged)  # refuse to install a package the agent would refuse
    replace_dir(staged, out / name)
    progress(f"done in {seconds} s")
    return {"name": name, "status": "built", "seconds": seconds, "files": files, "report": report}


def cached_entry(directory: Path) -> dict:
    stored = json.loads((directory / KEY_FILE).read_text())
    report_file = directory / "evaluation.json"
    report = json.loads(report_file.read_text()) if report_file.is_file() else None
    return {
        "name": directory.name,
        "status": "cached",
        "seconds": 0.0,
        "files": stored["files"],
        "report": report,
    }


def print_summary(entries: list[dict], total: float, stream) -> None:
    print(f"\nzoo: {len(entries)} directories in {total:.1f} s", file=stream)
    for entry in entries:
        size = sum(entry["files"].values()) / 1e6
        print(
            f"  {entry['name']:<20} {entry['status']:<7} {entry['seconds']:>6.1f} s "
            f"{size:>7.1f} MB",
            file=stream,
        )
        for key, figures in ((entry.get("report") or {}).get("variants") or {}).items():
            print(f"      {key:<20} {_figures(figures)}", file=stream)


def _figures(figures: dict) -> str:
    """One variant's line: a classifier's top-1 agreement (and accuracy), a detector's mAP."""
    distance = f"max |Δ| {figures['max_abs_diff']:.2e}"
    if "map50" in figures:
        return f"mAP@0.5 {figures['map50']:.3f}  {distance}"
    extra = f"  accuracy {figures['accuracy']:.4f}" if "accuracy" in figures else ""
    return f"top-1 agreement {figures['top1_agreement']:.3f}  {distance}{extra}"


def parse_args(argv: list[str] | None):
    from modelbuild.specs import FORMATS, SPECS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "zoo", help="zoo directory")
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SPECS),
        metavar="NAME",
        help=f"build only this package (repeatable): {', '.join(SPECS)}",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight/data seed (default 0)")
    parser.add_argument(
        "--formats",
        default=",".join(FORMATS),
        help="comma-separated subset of onnx,tflite,openvino (onnx is required:"
        " it is the FP32 reference)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="packages built in parallel, one process each (default: 2, or 1 on one core)",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even when cached")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    args = parser.parse_args(argv)
    formats = tuple(f for f in FORMATS if f in args.formats.split(","))
    unknown = set(args.formats.split(",")) - set(FORMATS)
    if unknown or "onnx" not in formats:
        parser.error(f"--formats {args.formats!r}: use a subset of {','.join(FORMATS)} with onnx")
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: must be at least 1")
    args.formats = formats
    return args


def main(argv: list[str] | None = None) -> int:
    from modelbuild.specs import SPECS

    args = parse_args(argv)
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    names = [SAMPLES, *(n for n in SPECS if n in (args.only or SPECS))]
    started = time.perf_counter()
    entries: dict[str, dict] = {}
    failed: dict[str, BaseException] = {}
    with exclusive(out), stdout_to_stderr() as real_stdout:
        for leftover in [*out.glob(".*.partial"), *out.glob(".*.old")]:
            shutil.rmtree(leftover)  # from a build that was killed before it could clean up
        todo = []
        for name in names:
            key = build_key(name, args.seed, args.formats)
            if not args.force and is_current(out / name, key):
                _progress(name)("up to date (build key matches), skipped")
                entries[name] = cached_entry(out / name)
            else:
                todo.append((name, key))
        if todo:
            context = multiprocessing.get_context("spawn")  # never fork a process holding torch
            with ProcessPoolExecutor(
                min(args.jobs, len(todo)), mp_context=context, initializer=setup_worker
            ) as pool:
                futures = {
                    pool.submit(build_one, out, name, key, args.seed, args.formats): name
                    for name, key in todo
                }
                for future in as_completed(futures):
                    name = futures[future]
                    try:
                        entries[name] = future.result()
                    except Exception as exc:
                        _progress(name)(f"FAILED: {type(exc).__name__}: {exc}")
                        failed[name] = exc
        total = time.perf_counter() - started
        ordered = [entries[n] for n in names if n in entries]
        print_summary(ordered, total, sys.stderr)
        for name, exc in failed.items():
            print(f"  {name:<20} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        if args.json:
            summary = {
                "out": str(out),
                "seconds": round(total, 1),
                "packages": ordered,
                "failed": {name: f"{type(exc).__name__}: {exc}" for name, exc in failed.items()},
            }
            json.dump(summary, real_stdout, indent=2)
            real_stdout.write("\n")
        real_stdout.close()
    return 1 if failed else 0


def _progress(name: str):
    def report(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {name}: {message}", file=sys.stderr, flush=True)

    return report


if __name__ == "__main__":
    sys.exit(main())
