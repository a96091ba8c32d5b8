"""MCP client (issue 12 "MCP client"), on the official ``mcp`` Python SDK: one
``McpServer`` connection per configured server (stdio or streamable HTTP) with reconnect
and clean shutdown, and the ``McpManager`` that turns their tools into tidegate tools named
``mcp__<server>__<tool>`` in the policy group ``plugin:mcp:<server>``."""
