"""vigil: worldmodel."""
