"""Inbound webhooks (``hooks.<name>`` in config.yaml, docs/webhooks.md): signature checks
(``verify``), the turn's text from the JSON body (``template``) and the HTTP route that
starts the turn or queues the system event (``routes``)."""
