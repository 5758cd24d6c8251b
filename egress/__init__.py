"""The outbound-HTTP guard shared by tools, MCP servers and model providers (SSRF: allow-lists, private ranges, pinned DNS)."""
