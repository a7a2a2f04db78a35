"""vigil: monitor."""
