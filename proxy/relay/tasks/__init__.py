"""MCP tasks the proxy hosts or bridges: the 2025-11-25 core tasks and the 2026-07-28 tasks
extension, for clients of either era (docs/translation.md, the tasks sections)."""
