"""Sizes the wire protocol never exceeds, shared by the device, the hub and their settings.

Kept apart from ``signing`` so that reading a config file does not import the crypto stack.
"""

from __future__ import annotations

# The one cap on a signed envelope (release manifest or trust file): a manifest is ~1 KiB, a
# trust file a few; ``[updates] max_manifest_bytes`` and ``[mqtt] max_message_bytes`` default
# to it, and the hub checks what it publishes against it.
MAX_ENVELOPE_BYTES = 64 * 1024
