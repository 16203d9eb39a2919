#!/usr/bin/env python3
"""What sealing costs at load time: decrypt + load from memory against a plain load from disk.

For one zoo variant (default: MobileNetV3-Small, onnxruntime fp32), the package is sealed
for a fresh device key the way ``hub sign --encrypt`` does it and unpacked the way a device
installs it; then, in alternating rounds, the same variant is loaded

- **plain**: ``runtime.load`` from the file on disk (what an unencrypted release does), and
- **sealed**: unwrap the content key, AES-256-GCM-decrypt the file into memory and
  ``runtime.load`` from those bytes (``models.session.load_request`` with the ``Unsealer``),

and the decrypt alone is timed too. Medians of the rounds, and the ratio sealed / plain from
the same run, so the figure does not depend on the machine's speed.

    python scripts/bench_encrypt.py [--model mobilenet_v3_small] [--variant onnxruntime/fp32]
                                    [--rounds 9] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402

from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.hub.sign import archive_package  # noqa: E402
from edgeagent.models.package import WRAPPED_KEY, load_package, sealed_dir  # noqa: E402
from edgeagent.models.session import load_request  # noqa: E402
from edgeagent.models.unsealer import Unsealer  # noqa: E402
from edgeagent.runtimes import get_runtime  # noqa: E402


def install_sealed(source: Path, root: Path, device: X25519PrivateKey) -> Path:
    """The package as a device holds it after a sealed release: plain shared files, sealed
    variant files, the content keys wrapped for ``device``."""
    work = root.parent / "archives"
    work.mkdir(parents=True, exist_ok=True)
    archives = archive_package(source, work, {"bench": device.public_key()})
    for artifact in archives.data().values():
        with tarfile.open(artifact.path, mode="r:gz") as archive:
            archive.extractall(root, filter="data")
    for key, encryption in archives.encryption.items():
        (sealed_dir(root, key) / WRAPPED_KEY).write_bytes(encryption.recipients["bench"])
    return root


def timed(work) -> float:
    started = time.perf_counter()
    work()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="mobilenet_v3_small", help="a zoo model (in $EDGEAGENT_ZOO if set)"
    )
    parser.add_argument("--variant", default="onnxruntime/fp32", help="runtime/precision")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runtime_name, precision = args.variant.split("/")
    device = X25519PrivateKey.generate()
    unsealer = Unsealer(lambda: device)
    with tempfile.TemporaryDirectory() as tmp:
        plain = load_package(zoo_dir() / args.model)
        sealed = load_package(install_sealed(plain.root, Path(tmp) / "installed", device))
        plain_variant = plain.variant(runtime_name, precision)
        sealed_variant = sealed.variant(runtime_name, precision)
        assert plain_variant is not None and sealed_variant is not None
        runtime = get_runtime(runtime_name)
        runtime.load(load_request(plain, plain_variant)).close()  # warm the runtime's import
        times: dict[str, list[float]] = {"plain": [], "sealed": [], "decrypt": []}
        for _ in range(args.rounds):  # alternate, so drift hits both alike
            times["plain"].append(
                timed(lambda: runtime.load(load_request(plain, plain_variant)).close())
            )
            times["sealed"].append(
                timed(
                    lambda: runtime.load(
                        load_request(sealed, sealed_variant, unsealer=unsealer)
                    ).close()
                )
            )
            times["decrypt"].append(timed(lambda: unsealer.contents(sealed, sealed_variant)))
    size = sum(f.stat().st_size for f in plain_variant.files)
    medians = {name: round(statistics.median(values), 2) for name, values in times.items()}
    result = {
        "model": args.model,
        "variant": args.variant,
        "bytes": size,
        "rounds": args.rounds,
        "median_ms": medians,
        "sealed_over_plain": round(medians["sealed"] / medians["plain"], 3),
    }
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(
            f"{args.model} {args.variant} ({size / 1e6:.1f} MB), median of {args.rounds} "
            f"alternating rounds: plain load {medians['plain']} ms, decrypt + load "
            f"{medians['sealed']} ms (decrypt alone {medians['decrypt']} ms), "
            f"ratio {result['sealed_over_plain']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
