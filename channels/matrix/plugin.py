"""Matrix as a channel plugin (entry point ``matrix`` of ``tidegate.channels``).

Imports only the config model; the adapter (matrix-nio) is imported when an account is
created. The sync position lives in ``channels/matrix-<account>-sync.json``, or in the
shared ``state_documents`` row ``matrix/<account>/sync.json`` on PostgreSQL
(channels/matrix/sync_state.py).
"""

from __future__ import annotations

from typing import Any

from channels.matrix.config import MatrixChannelConfig
from channels.sdk import Capabilities, ChannelContext, ChannelPlugin, SetupField


async def probe(account: Any, timeout: float) -> tuple[bool, str]:
    """``whoami`` on the homeserver (channels/matrix/probe.py)."""
    from channels.matrix.probe import probe as whoami
    return await whoami(account, timeout)


def create(account_id: str, config: Any, context: ChannelContext) -> Any:
    """A ``MatrixChannel`` for one account. Raises ValueError for missing credentials."""
    from channels.matrix.adapter import MatrixChannel
    return MatrixChannel(account_id, config, clock=context.clock, media=context.media,
                         state_store=context.document("sync.json"))


PLUGIN = ChannelPlugin(
    name="matrix", config=MatrixChannelConfig, create=create,
    description="A Matrix bot user (client-server API /sync; several under accounts).",
    capabilities=Capabilities(threads=True, edits=True, reactions=True, files=True,
                              buttons=False, markup="matrix", text_limit=4000),
    probe=probe,
    setup=(SetupField("homeserver", "matrix homeserver URL (https://matrix.example.org)"),
           SetupField("user_id", "the bot's matrix user id (@bot:example.org)"),
           SetupField("access_token", "matrix access token of the bot (empty: log in with "
                      "its password)",
                      secret=True, env="MATRIX_ACCESS_TOKEN", optional=True),
           SetupField("password", "matrix password of the bot", secret=True,
                      env="MATRIX_PASSWORD",
                      unless="access_token")))
