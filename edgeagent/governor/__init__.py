"""edgeagent.governor"""
