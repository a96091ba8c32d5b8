"""Web tools (issue 12): ``web_fetch`` (aiohttp, SSRF guard, trafilatura to Markdown) and
``web_search`` (Brave, SearXNG, Tavily behind one interface), both cached 15 minutes and
returning their content wrapped as untrusted."""

from runtime.tools.web.tools import WEB_TOOLS, WebTools

__all__ = ["WEB_TOOLS", "WebTools"]
