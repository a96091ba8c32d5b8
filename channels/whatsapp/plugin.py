"""WhatsApp (Cloud API) as a channel plugin (entry point ``whatsapp`` of
``tidegate.channels``).

Imports only the config model; the adapter is imported when an account is created.
"""

from __future__ import annotations

from typing import Any

from channels.sdk import Capabilities, ChannelContext, ChannelPlugin, SetupField
from channels.whatsapp.config import WhatsAppChannelConfig


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """The Graph API lookup of the phone number (channels/whatsapp/probe.py)."""
    from channels.whatsapp.probe import probe as number_lookup
    return await number_lookup(account, timeout)


def create(account_id: str, config: Any, context: ChannelContext) -> Any:
    """A ``WhatsAppChannel`` for one phone number; its 24-hour windows persist in the
    account's document ``windows.json`` (a file under ``<state_dir>/channels/``, or the
    shared PostgreSQL row). Raises ValueError for a missing access_token,
    phone_number_id, app_secret or verify_token."""
    from channels.whatsapp.adapter import WhatsAppChannel
    return WhatsAppChannel(account_id, config, clock=context.clock, media=context.media,
                           windows_document=context.document("windows.json")
                           if context.state_dir is not None else None,
                           problems=context.problems)


PLUGIN = ChannelPlugin(
    name="whatsapp", config=WhatsAppChannelConfig, create=create,
    description=("WhatsApp through the Cloud API (webhook in, Graph API out; several numbers "
                 "under accounts)."),
    capabilities=Capabilities(threads=False, edits=False, drafts=False, reactions=True,
                              files=True, buttons=False, markup="whatsapp",
                              text_limit=4096),
    probe=probe,
    setup=(SetupField("phone_number_id", "whatsapp phone number id (WhatsApp Manager, API "
                      "Setup; the id, not the number)"),
           SetupField("access_token", "whatsapp access token (a system user's, with "
                      "whatsapp_business_messaging)", secret=True, env="WHATSAPP_ACCESS_TOKEN"),
           SetupField("app_secret", "whatsapp app secret (App settings, Basic)", secret=True,
                      env="WHATSAPP_APP_SECRET"),
           SetupField("verify_token", "whatsapp webhook verify token (any string; type the "
                      "same into the app's webhook settings)", secret=True,
                      env="WHATSAPP_VERIFY_TOKEN"),
           SetupField("api_base_url", "Graph API base URL", advanced=True)))
