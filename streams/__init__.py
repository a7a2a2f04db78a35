"""vigil: streams."""
