"""The torch model builder (build time only): network definitions and the export, quantize and
package pipeline that makes the zoo's packages (``zoo/``).

Imported only by ``scripts/build_models.py`` from the build venv (torch, litert-torch, onnx);
nothing here is ever imported by the agent at run time.
"""
