"""Every outcome code a device reports, named once for the device and the hub.

An outcome's ``code`` says, for machines, why a release or trust message ended as it did; the
hub reads some back (``SAME_VERSION`` means the device already has the release), dashboards
count by them and operators grep for them. Spelled inline they drifted apart; here each is a
constant with its meaning, and ``docs/fleet/messages.md`` lists exactly these
(``tests/unit/test_one_home.py`` checks both). Plain ``str`` constants, not an ``Enum``: they
travel in JSON and in f-strings unchanged, whatever the Python version formats enums as.
"""

from __future__ import annotations

from typing import Final

# --- succeeded -----------------------------------------------------------------------------
COMMITTED: Final = "committed"
RECOVERED_COMMITTED: Final = "recovered_committed"
RECOVERED_ROLLED_BACK: Final = "recovered_rolled_back"
ROTATED: Final = "rotated"

# --- installed, then rolled back (or refused when it ended before anything was installed) ---
LOAD_FAILED: Final = "load_failed"
HEALTH_CHECK_FAILED: Final = "health_check_failed"
HEALTH_CHECK_INTERRUPTED: Final = "health_check_interrupted"
CANARY_FAILED: Final = "canary_failed"
CANARY_INTERRUPTED: Final = "canary_interrupted"
CANARY_SUPERSEDED: Final = "canary_superseded"
INSUFFICIENT_MEMORY: Final = "insufficient_memory"
MODEL_NOT_SERVED: Final = "model_not_served"
INTERNAL_ERROR: Final = "internal_error"
DEADLINE: Final = "deadline"
NO_COMMIT: Final = "no_commit"
VERSION_MISMATCH: Final = "version_mismatch"

# --- the download or the package failed; nothing was installed ------------------------------
DOWNLOAD_FAILED: Final = "download_failed"
TIMEOUT: Final = "timeout"
SLOW: Final = "slow"
TRUNCATED: Final = "truncated"
HASH_MISMATCH: Final = "hash_mismatch"
NO_SPACE: Final = "no_space"
UNSAFE_ARCHIVE: Final = "unsafe_archive"
BAD_PACKAGE: Final = "bad_package"
BAD_WHEELHOUSE: Final = "bad_wheelhouse"
VENV_FAILED: Final = "venv_failed"
IN_USE: Final = "in_use"
INSTALL_FAILED: Final = "install_failed"
CONFIG_REFUSED: Final = "config_refused"
STATE_REFUSED: Final = "state_refused"
NOT_AB_LAYOUT: Final = "not_ab_layout"

# --- refused before anything was downloaded ------------------------------------------------
SAME_VERSION: Final = "same_version"
REPLAY: Final = "replay"
ROLLBACK: Final = "rollback"
CANCELLED: Final = "cancelled"
EXPIRED: Final = "expired"
NOT_YET_VALID: Final = "not_yet_valid"
WRONG_TARGET: Final = "wrong_target"
WRONG_TOPIC: Final = "wrong_topic"
WRONG_PLATFORM: Final = "wrong_platform"
WRONG_PYTHON: Final = "wrong_python"
AGENT_TOO_OLD: Final = "agent_too_old"
NO_VARIANT: Final = "no_variant"
NOT_A_RECIPIENT: Final = "not_a_recipient"
KNOWN_BAD: Final = "known_bad"
TOO_LARGE: Final = "too_large"
CANARY_WAITING: Final = "canary_waiting"
SWITCH_PENDING: Final = "switch_pending"
SELF_UPDATE_OFF: Final = "self_update_off"
UNKNOWN_KEY: Final = "unknown_key"
BAD_SIGNATURE: Final = "bad_signature"
BELOW_THRESHOLD: Final = "below_threshold"
MALFORMED: Final = "malformed"
VERSION_GAP: Final = "version_gap"
STALE_STORE: Final = "stale_store"
NO_TRUST: Final = "no_trust"
NO_ROLE: Final = "no_role"
CORRUPT_STATE: Final = "corrupt_state"

MEANINGS: Final[dict[str, str]] = {
    COMMITTED: "installed, healthy and committed",
    RECOVERED_COMMITTED: "committed by the recovery after a crash between activation and commit",
    RECOVERED_ROLLED_BACK: "rolled back by the recovery after a crash before its commit",
    ROTATED: "a trust file rotation applied",
    LOAD_FAILED: "the new version did not load",
    HEALTH_CHECK_FAILED: "the new version failed its golden inputs or answered NaN",
    HEALTH_CHECK_INTERRUPTED: "the health check was cut short (the agent is stopping)",
    CANARY_FAILED: "the canary's live traffic judged the new version worse",
    CANARY_INTERRUPTED: "the canary was cut short before its verdict",
    CANARY_SUPERSEDED: "a newer release arrived while the canary ran (not marked bad)",
    INSUFFICIENT_MEMORY: "no room to load the canary beside the serving version",
    MODEL_NOT_SERVED: "a new agent could not serve a model that served before its switch",
    INTERNAL_ERROR: "an unexpected error in the updater; the release was rolled back",
    DEADLINE: "a new agent was not healthy within its switch deadline",
    NO_COMMIT: "a new agent started its boot limit without confirming its switch",
    VERSION_MISMATCH: "the installed agent's code says another version than its release",
    DOWNLOAD_FAILED: "the artifact could not be fetched",
    TIMEOUT: "the download took longer than allowed",
    SLOW: "the download stayed below the minimum rate",
    TRUNCATED: "the artifact ended before its signed size",
    HASH_MISMATCH: "the artifact's digest is not the signed one",
    NO_SPACE: "not enough free disk for the artifact",
    UNSAFE_ARCHIVE: "the archive holds paths or members outside its directory",
    BAD_PACKAGE: "the unpacked package is not a valid model package",
    BAD_WHEELHOUSE: "the agent's wheelhouse is incomplete or unreadable",
    VENV_FAILED: "the new agent's environment could not be built",
    IN_USE: "the agent's target directory is in use",
    INSTALL_FAILED: "the new agent version could not be installed into its environment",
    CONFIG_REFUSED: "the new agent version refuses the live config",
    STATE_REFUSED: "the new agent version cannot read the state directory",
    NOT_AB_LAYOUT: "the agent root is not the A/B layout self-updates switch",
    SAME_VERSION: "the device already has it (a re-send of what it committed)",
    REPLAY: "its serial is below the one committed here",
    ROLLBACK: "its version is below the one installed (before a first serial)",
    CANCELLED: "its deployment was cancelled by the hub's signed cancellation",
    EXPIRED: "its signature's validity ended",
    NOT_YET_VALID: "issued after this device's time (check the clock)",
    WRONG_TARGET: "not addressed to this device, its groups or its hardware",
    WRONG_TOPIC: "arrived on a topic that may not carry it",
    WRONG_PLATFORM: "an agent built for another platform",
    WRONG_PYTHON: "an agent built for another Python",
    AGENT_TOO_OLD: "needs a newer agent than this one",
    NO_VARIANT: "no variant runs on this device's hardware",
    NOT_A_RECIPIENT: "its sealed variants hold no content key for this device",
    KNOWN_BAD: "it failed here before",
    TOO_LARGE: "over a size limit (the message says which)",
    CANARY_WAITING: "a canary of this model is still running",
    SWITCH_PENDING: "an agent switch is on trial",
    SELF_UPDATE_OFF: "agent releases are not enabled on this device",
    UNKNOWN_KEY: "signed by a key the trust file does not hold",
    BAD_SIGNATURE: "a signature does not verify",
    BELOW_THRESHOLD: "fewer valid signatures than the role's threshold",
    MALFORMED: "the message cannot be read (the message says where)",
    VERSION_GAP: "a trust file that skips a version",
    STALE_STORE: "a trust file older than the one stored here",
    NO_TRUST: "this device has no trust file",
    NO_ROLE: "the trust file has no role for this kind of message",
    CORRUPT_STATE: "the device's trust clock file is unreadable",
}

CODES: Final = frozenset(MEANINGS)
