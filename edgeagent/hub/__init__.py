"""edgeagent.hub"""
