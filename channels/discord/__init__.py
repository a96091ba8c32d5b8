"""Discord (discord.py): adapter, client, inbound normalisation, sends."""
