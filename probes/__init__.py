"""vigil: probes."""
