"""Slack (slack-bolt / slack-sdk): adapter, Events/Web API glue, inbound normalisation, sends."""
