"""edgeagent.models"""
