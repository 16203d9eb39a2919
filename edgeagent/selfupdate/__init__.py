"""The agent updates itself: A/B versions, a boot-counted, health-checked switch, rollback.

``layout`` (the directories and the ``current`` / ``previous`` links), ``state`` (the pending
switch, the committed record, the outcome left for the next start), ``boot`` (the check that
runs before each start, from the known-good version), ``install`` (a wheelhouse into its own
venv, then the new version's ``config check``) and ``service`` (the running agent's side:
take a verified release, switch, and — in the new version — confirm and commit). The state
directory's format: ``migrations`` (one forward migration per format), ``stateformat`` (the
declared format, the check before a switch, the migration at start) and ``snapshot`` (what a
migration rewrote, kept under the root for the boot check's rollback). See
docs/fleet/agent-updates.md. Nothing here imports at package import: ``boot`` must stay cheap.
"""
