"""Which accelerator runs each model, and staying on a working one.

profile.py (device_profiles/*.toml schema, shipped in the package) → detect.py (which board is
this) → probe.py (does a candidate really load and answer) → choose.py (ranked or fastest, per
model) → fallback.py (a Session that demotes what fails) → service.py (the Accelerators façade
the daemon uses).
"""
