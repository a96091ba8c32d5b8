"""Telegram (python-telegram-bot): adapter, inbound normalisation, sends."""
