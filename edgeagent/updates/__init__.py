"""edgeagent.updates"""
