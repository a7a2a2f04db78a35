"""vigil: dashboards."""
