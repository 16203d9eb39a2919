"""The release side of a simulated fleet: hub keys, signed tiny releases, ``hub serve``.

What an operator sets up before the first rollout — ``hub keygen``, ``hub sign`` of a package,
``hub serve`` of the artifact directory — done with the same code, so every simulated device
downloads real artifacts over HTTP and checks them against the signed length and SHA-256. The
package is devtools' tiny ONNX classifier (a few hundred bytes per artifact), so ten thousand
downloads cost the network and disk next to nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from devtools.ports import free_port
from devtools.tiny import write_tiny_package
from edgeagent.hub.keys import keygen
from edgeagent.hub.sign import sign_package

MODEL = "tiny"


class ReleaseSite:
    """Keys in ``<root>/keys``, artifacts in ``<root>/artifacts`` served by ``hub serve``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.keys = root / "keys"
        self.artifacts = root / "artifacts"
        self.keys.mkdir(parents=True)
        self.artifacts.mkdir()
        keygen(self.keys)
        self.release_key = self.keys / "release.key"
        self.trust_file = self.keys / "trust.json"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        """``edgeagent hub serve`` on the artifact directory, once it printed its URL."""
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "edgeagent.cli", "hub", "serve", str(self.artifacts)),
                *("--host", "127.0.0.1", "--port", str(self.port)),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        if not first.startswith("serving "):
            raise RuntimeError(f"hub serve did not start: {first}{self.process.stdout.read()}")

    def sign(self, version: str) -> bytes:
        """``hub sign`` of the tiny package at ``version``; returns the release envelope."""
        package = write_tiny_package(self.root / f"package-{version}", name=MODEL, version=version)
        _, envelope = sign_package(
            package, key_paths=[self.release_key], base_url=self.url, out_dir=self.artifacts
        )
        return envelope.read_bytes()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            if self.process.stdout is not None:
                self.process.stdout.close()
            self.process = None
