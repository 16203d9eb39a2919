"""edgeagent.hardware"""
