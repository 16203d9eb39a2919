"""``edgeagent package``: any model file → a validated, optimised model package (SPEC §13).

sources (read what a file says) → options (what the user adds) → variants (optimise and
convert) → validate (each variant against the fp32 reference) → write (model.toml, golden.npz,
validation.json). A build-time tool: it imports onnx, onnxruntime's quantizer and OpenVINO's
converter, none of which the agent needs to serve the result.
"""
