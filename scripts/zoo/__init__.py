"""Build-time model zoo: network definitions and the export/quantize/package pipeline.

Imported only by ``scripts/build_models.py`` from the build venv (torch, litert-torch, onnx);
nothing here is ever imported by the agent at run time.
"""
