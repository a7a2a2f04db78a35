"""vigil where agents already run: in front of an MCP server (:mod:`.mcp_proxy`)."""
