"""Web tools (issue 12): ``web_fetch`` (aiohttp, SSRF guard, trafilatura to Markdown) and
``web_search`` (Brave, SearXNG, Tavily behind one interface), both cached 15 minutes and
returning their content wrapped as untrusted. The tools are in ``tools.py``; this package
init stays empty so that loading the config (``config.py``) imports no HTTP stack."""
