"""Foundations every other vigil package may use: the ``$VIGIL_HOME`` layout (``paths``) and
the local language model that both the probes and the reviewer load (``lm``).

``vigil`` imports none of the project's other packages.
"""
