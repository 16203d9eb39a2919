"""Learning from the field, on the device: capture rules, redaction, the sealed spool, upload.

Fed by a data-plane hook (``engine.hooks``): the engine never calls capture, and capture never
sits on a request's path — the hook checks the rules and enqueues or drops, a worker does the
rest.
"""
