"""Parsing large JSON infer bodies fast: simdjson, and a helper process outside the GIL.

Imports nothing, so the helper process (``helper_process``) stays small.
"""
