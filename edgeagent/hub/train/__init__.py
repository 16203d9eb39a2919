"""Training at the hub on what devices captured (torch is a build-time tool, as in packaging)."""
