"""Foundations every other vigil package may use: the ``$VIGIL_HOME`` layout and the local LM loader.

``vigil`` imports none of the project's other packages.
"""
