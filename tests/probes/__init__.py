"""Tests of the L1 activation probes."""
