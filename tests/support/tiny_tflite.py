"""A tiny LiteRT (TFLite) classifier package, written with the flatbuffer schema that ships in
ai-edge-litert: what a test serves when it needs LiteRT's native code to run but not the zoo."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from devtools.tiny import tiny_manifest, write_tiny_package
from edgeagent.models.manifest_writer import VariantFiles, write_manifest


def tiny_tflite(classes: int = 4, size: int = 8, seed: int = 0) -> bytes:
    """(N, size, size, 3) NHWC → mean over the pixels → a linear layer → (N, classes) logits."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as tfl

    weights = np.random.default_rng(seed).standard_normal((classes, 3)).astype(np.float32)
    model = tfl.ModelT()
    model.version = 3
    model.description = "edgeagent tests: tiny"
    model.operatorCodes = []
    for builtin in (tfl.BuiltinOperator.MEAN, tfl.BuiltinOperator.FULLY_CONNECTED):
        code = tfl.OperatorCodeT()
        code.builtinCode = code.deprecatedBuiltinCode = builtin
        model.operatorCodes.append(code)
    model.buffers = [tfl.BufferT() for _ in range(5)]  # buffer 0 is the schema's empty one
    model.buffers[2].data = np.array([1, 2], np.int32).tobytes()
    model.buffers[3].data = weights.tobytes()

    def tensor(name: str, shape: list[int], kind: int, buffer: int) -> tfl.TensorT:
        made = tfl.TensorT()
        made.name, made.shape, made.type, made.buffer = name, shape, kind, buffer
        return made

    f32, i32 = tfl.TensorType.FLOAT32, tfl.TensorType.INT32
    graph = tfl.SubGraphT()
    graph.tensors = [
        tensor("input", [1, size, size, 3], f32, 1),
        tensor("axes", [2], i32, 2),
        tensor("weights", [classes, 3], f32, 3),
        tensor("pooled", [1, 3], f32, 4),
        tensor("logits", [1, classes], f32, 0),
    ]
    mean, dense = tfl.OperatorT(), tfl.OperatorT()
    mean.opcodeIndex, mean.inputs, mean.outputs = 0, [0, 1], [3]
    mean.builtinOptionsType = tfl.BuiltinOptions.ReducerOptions
    mean.builtinOptions = tfl.ReducerOptionsT()
    dense.opcodeIndex, dense.inputs, dense.outputs = 1, [3, 2, -1], [4]
    dense.builtinOptionsType = tfl.BuiltinOptions.FullyConnectedOptions
    dense.builtinOptions = tfl.FullyConnectedOptionsT()
    graph.operators = [mean, dense]
    graph.inputs, graph.outputs = [0], [4]
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


def write_tiny_litert_package(root: Path, name: str = "tiny") -> Path:
    """The tiny package with one LiteRT fp32 variant instead of its ONNX one."""
    write_tiny_package(root, name=name)
    (root / f"{name}.fp32.onnx").unlink()
    model_file = root / f"{name}.fp32.tflite"
    model_file.write_bytes(tiny_tflite())
    litert = VariantFiles("litert", "fp32", (model_file.name,), "NHWC")
    write_manifest(root, tiny_manifest(name, "1", 4, (litert,)))
    return root
