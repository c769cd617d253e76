"""Fake hip-python package (`from hip import hip`), see hip.py."""
