"""Shared-memory regions a benchmark registers with the agent, and the infer bodies naming them.

The KServe system shared-memory extension: the frame is written once into an input region,
each client worker gets its own output region (so concurrent answers never overwrite one
another), and every request body carries region names instead of tensor bytes.
"""

from __future__ import annotations

import json
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from devtools.http_endpoint import http_client


class ShmRegions:
    """One input region holding the frame and one output region per client worker."""

    def __init__(self, package, frame: np.ndarray, workers: int) -> None:
        self.package = package
        self.input = shared_memory.SharedMemory(create=True, size=frame.nbytes)
        np.ndarray(frame.shape, frame.dtype, buffer=self.input.buf)[...] = frame
        self.shape = list(frame.shape)
        self.output_bytes = 4 * int(np.prod([1, *package.outputs[0].shape[1:]]))
        self.outputs = [
            shared_memory.SharedMemory(create=True, size=self.output_bytes) for _ in range(workers)
        ]

    async def register(self, sock: Path) -> list[bytes]:
        """Register every region with the daemon; the infer body of each worker."""
        regions = [("bench-in", self.input)] + [
            (f"bench-out-{i}", region) for i, region in enumerate(self.outputs)
        ]
        async with http_client(sock) as client:
            for name, region in regions:
                body = {"key": "/" + region.name, "offset": 0, "byte_size": region.size}
                url = f"/v2/systemsharedmemory/region/{name}/register"
                async with client.post(url, json=body) as response:
                    if response.status != 200:
                        raise SystemExit(f"{url}: {response.status} {await response.text()}")
        spec = self.package.inputs[0]
        return [
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": spec.name,
                            "shape": self.shape,
                            "datatype": "FP32",
                            "parameters": {
                                "shared_memory_region": "bench-in",
                                "shared_memory_byte_size": self.input.size,
                            },
                        }
                    ],
                    "outputs": [
                        {
                            "name": self.package.outputs[0].name,
                            "parameters": {
                                "shared_memory_region": f"bench-out-{i}",
                                "shared_memory_byte_size": self.output_bytes,
                            },
                        }
                    ],
                }
            ).encode()
            for i in range(len(self.outputs))
        ]

    def close(self) -> None:
        for region in [self.input, *self.outputs]:
            region.close()
            region.unlink()
