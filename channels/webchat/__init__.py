"""The webchat channel and the gateway's control UI: one page (``static/index.html``,
plain HTML/CSS/JS, no build step) served on loopback behind the gateway token, and its
WebSocket (``routes.py``). The page's views (sessions, cron, channels, usage, problems,
logs) read the control API with the same token."""

from channels.webchat.routes import webchat_routes

__all__ = ["webchat_routes"]
