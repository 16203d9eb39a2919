#!/usr/bin/env python3
"""What a delta update ships, measured on real cases, and which binary-diff library makes it.

Cases (each a base and a new release as the hub archives them, ``hub.sign.archive_package``):

- **head retrain, new classes**: the zoo's MobileNetV2 with its classifier replaced by a
  10-class head trained on the backbone's features (``scripts/retrain_head.py --classes 10``,
  PyTorch from ``.venv-build``): the usual transfer learning of a deployed model;
- **head fine-tune, same classes**: the 1000-class head fine-tuned in place with Adam, which
  moves every one of its 1.28 M weights — the worst case for a diff (the head is 36 % of the
  file's bytes);
- **agent patch release**: the agent's wheelhouse (its wheel and every dependency wheel, as
  ``hub sign --agent`` packs it) where only edgeagent's own wheel changed (one module edited,
  version bumped).

For each case and each library — zstd ``--patch-from`` (``zstandard``, what the hub ships),
``bsdiff4``, ``detools`` (its sequential bsdiff, lzma) — the patch's bytes against the full
``.tar.gz`` artifacts a device would download otherwise, and the time to make and to apply it
(medians over ``--rounds``, the libraries alternating). All diffs work on the uncompressed
tars (``fleet.artifact`` says why). Then the real path: ``sign_package(delta_from=…)`` signs
the new model release with patches and ``updates.deltas.apply_delta`` rebuilds and verifies
each tar from the base, as a device does.

    python scripts/bench_update.py --deltas [--rounds 3] [--json] [--quick]
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bsdiff4
import detools
import zstandard

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgeagent.hub.agent_release import wheelhouse_tar  # noqa: E402
from edgeagent.hub.deltas import make_patch  # noqa: E402
from edgeagent.hub.keys import keygen  # noqa: E402
from edgeagent.hub.sign import archive_package, release_path, sign_package  # noqa: E402
from edgeagent.updates.deltas import apply_delta, window_bytes  # noqa: E402

BUILD_PYTHON = REPO / ".venv-build" / "bin" / "python"
Pair = tuple[bytes, bytes]  # (base tar, new tar)


def _zstd_apply(base: bytes, patch: bytes) -> bytes:
    dictionary = zstandard.ZstdCompressionDict(base, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    reader = zstandard.ZstdDecompressor(
        dict_data=dictionary, max_window_size=window_bytes(len(base))
    )
    return reader.decompress(patch)


def _detools_make(base: bytes, new: bytes) -> bytes:
    out = io.BytesIO()
    detools.create_patch(io.BytesIO(base), io.BytesIO(new), out, compression="lzma")
    return out.getvalue()


def _detools_apply(base: bytes, patch: bytes) -> bytes:
    out = io.BytesIO()
    detools.apply_patch(io.BytesIO(base), io.BytesIO(patch), out)
    return out.getvalue()


LIBRARIES: dict[str, tuple[Callable[[bytes, bytes], bytes], Callable[[bytes, bytes], bytes]]] = {
    "zstd --patch-from": (make_patch, _zstd_apply),
    "bsdiff4": (bsdiff4.diff, bsdiff4.patch),
    "detools": (_detools_make, _detools_apply),
}


def measure(
    pairs: list[Pair], full_bytes: int, rounds: int, libraries: tuple[str, ...] = tuple(LIBRARIES)
) -> dict[str, dict[str, float]]:
    """Per library: patch bytes (all pairs), ratio to ``full_bytes``, make and apply seconds."""
    times: dict[str, dict[str, list[float]]] = {n: {"make": [], "apply": []} for n in libraries}
    sizes: dict[str, int] = {}
    for round_index in range(rounds):
        order = list(libraries) if round_index % 2 == 0 else list(reversed(libraries))
        for name in order:
            make, apply = LIBRARIES[name]
            made = applied = 0.0
            total = 0
            for base, new in pairs:
                started = time.perf_counter()
                patch = make(base, new)
                made += time.perf_counter() - started
                started = time.perf_counter()
                assert apply(base, patch) == new, f"{name} did not rebuild the tar"
                applied += time.perf_counter() - started
                total += len(patch)
            sizes[name] = total
            times[name]["make"].append(made)
            times[name]["apply"].append(applied)
    return {
        name: {
            "patch_bytes": sizes[name],
            "ratio": sizes[name] / full_bytes,
            "make_s": statistics.median(times[name]["make"]),
            "apply_s": statistics.median(times[name]["apply"]),
        }
        for name in libraries
    }


def _tars(archives: dict[str, bytes]) -> dict[str, bytes]:
    return {key: gzip.decompress(data) for key, data in archives.items()}


def _archive_bytes(package: Path, work: Path) -> dict[str, bytes]:
    """The package's release archives (``hub.sign.archive_package``) as bytes, by key."""
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        archives = archive_package(package, Path(scratch))
        return {key: archive.path.read_bytes() for key, archive in archives.data().items()}


def model_case(work: Path, classes: int | None) -> tuple[list[Pair], int, Path, Path]:
    out = work / f"retrain-{classes or 'same'}"
    command = [str(BUILD_PYTHON), str(REPO / "scripts" / "retrain_head.py")]
    command += [str(REPO / "zoo" / "mobilenet_v2"), str(out)]
    command += ["--classes", str(classes)] if classes else []
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    old, new = (_archive_bytes(out / name, work) for name in ("base", "retrained"))
    old_tars, new_tars = _tars(old), _tars(new)
    pairs = [(old_tars[key], new_tars[key]) for key in new_tars]
    return pairs, sum(len(data) for data in new.values()), out / "base", out / "retrained"


def _agent_wheel(work: Path, version: str, edit: bool) -> Path:
    """``pip wheel`` of this tree at ``version`` (with one module edited when ``edit``)."""
    tree = work / f"src-{version}"
    shutil.copytree(
        REPO / "edgeagent",
        tree / "edgeagent",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    init = tree / "edgeagent" / "__init__.py"
    init.write_text(
        re.sub(r'(?m)^__version__ = "[^"]+"', f'__version__ = "{version}"', init.read_text())
    )
    if edit:  # a patch release: one fix in one module
        module = tree / "edgeagent" / "updates" / "deltas.py"
        module.write_text(module.read_text().replace("_CHUNK = 1 << 20", "_CHUNK = 1 << 19"))
    wheels = work / f"wheels-{version}"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".",
         "-w", str(wheels)],
        cwd=tree, check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return next(wheels.glob("edgeagent-*.whl"))


def agent_case(work: Path) -> tuple[list[Pair], int, dict[str, int]]:
    from devtools.wheelhouse import dependency_wheels

    old_wheel = _agent_wheel(work, "0.1.0", edit=False)
    new_wheel = _agent_wheel(work, "0.1.1", edit=True)
    dependencies = work / "dependencies"
    dependency_wheels(old_wheel, dependencies)
    houses = {}
    for label, wheel in (("old", old_wheel), ("new", new_wheel)):
        house = work / f"house-{label}"
        shutil.copytree(dependencies, house)
        shutil.copy(wheel, house / wheel.name)
        houses[label] = wheelhouse_tar(house)
    sizes = {"wheelhouse": len(houses["new"]), "edgeagent_wheel": new_wheel.stat().st_size}
    pair = (gzip.decompress(houses["old"]), gzip.decompress(houses["new"]))
    return [pair], len(houses["new"]), sizes


def signed_path(work: Path, base: Path, new: Path) -> dict[str, Any]:
    """The hub's own path: sign base, then new with --delta-from; rebuild each tar on the
    'device' with ``apply_delta`` (hash-checked) and count what it downloads."""
    keys, out = work / "keys", work / "artifacts"
    keys.mkdir()
    out.mkdir()
    keygen(keys)
    options = {"key_paths": [keys / "release.key"], "base_url": "http://hub", "out_dir": out}
    sign_package(base, **options)
    old_release = release_path(out, "mobilenet_v2", "1.0.0")
    started = time.perf_counter()
    sign_package(new, **options, delta_from=old_release)
    signing_s = time.perf_counter() - started
    from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
    from edgeagent.fleet.manifest import parse_manifest
    from edgeagent.fleet.signing import decode_envelope

    envelope = release_path(out, "mobilenet_v2", "1.1.0").read_bytes()
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=MAX_ENVELOPE_BYTES).payload)
    old_archives = {p.name: p for p in out.glob("mobilenet_v2-1.0.0*.tar.gz")}
    downloaded = full = 0
    for artifact in (manifest.artifact, *(v.artifact for v in manifest.variants)):
        full += artifact.size
        delta = artifact.delta
        if delta is None:
            downloaded += artifact.size
            continue
        downloaded += delta.size
        base_tar = next(
            t
            for t in (gzip.decompress(p.read_bytes()) for p in old_archives.values())
            if hashlib.sha256(t).hexdigest() == delta.base
        )
        (work / "base.tar").write_bytes(base_tar)
        patch = out / delta.url.rsplit("/", 1)[-1]
        apply_delta(work / "base.tar", patch, work / "new.tar", delta, 1 << 30)
    return {"downloaded": downloaded, "full": full, "ratio": downloaded / full, "sign_s": signing_s}


def run(rounds: int, quick: bool = False) -> dict[str, Any]:
    """Every case (module docstring); ``quick``: the new-head case with zstd only (the smoke
    test's cut)."""
    results: dict[str, Any] = {}
    libraries = ("zstd --patch-from",) if quick else tuple(LIBRARIES)
    cases = (("head retrain, 10 new classes", 10), ("head fine-tune, same 1000", None))
    with tempfile.TemporaryDirectory(prefix="bench-deltas-") as scratch:
        work = Path(scratch)
        for label, classes in cases[:1] if quick else cases:
            pairs, full, base, new = model_case(work, classes)
            found = measure(pairs, full, rounds, libraries)
            results[label] = {"full_bytes": full, "libraries": found}
            if classes:
                case = work / "signed"
                case.mkdir()
                results[label]["signed"] = signed_path(case, base, new)
        if quick:
            return results
        pairs, full, sizes = agent_case(work / "agent")
        results["agent patch release"] = {
            "full_bytes": full,
            **sizes,
            # tens of MB: one round, zstd only (bsdiff's suffix sort wants ~17x the input in
            # memory and minutes of CPU; the model cases already rank the libraries)
            "libraries": measure(pairs, full, 1, ("zstd --patch-from",)),
        }
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| case | full artifacts | library | patch | of full | make | apply |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for case, found in results.items():
        for name, row in found["libraries"].items():
            lines.append(
                f"| {case} | {found['full_bytes'] / 1e6:.2f} MB | {name} | "
                f"{row['patch_bytes'] / 1e3:.1f} kB | {100 * row['ratio']:.2f} % | "
                f"{row['make_s']:.1f} s | {row['apply_s']:.2f} s |"
            )
    return "\n".join(lines)


def main(rounds: int, as_json: bool, quick: bool = False) -> None:
    results = run(rounds, quick)
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(table(results))
    for case, found in results.items():
        if "signed" in found:
            signed = found["signed"]
            print(
                f"\n{case}, signed by hub sign --delta-from and applied as a device does: "
                f"{signed['downloaded']} of {signed['full']} bytes "
                f"({100 * signed['ratio']:.2f} %), signing {signed['sign_s']:.1f} s"
            )
