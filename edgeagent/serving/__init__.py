"""edgeagent.serving"""
