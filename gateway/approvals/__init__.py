"""Exec approvals in the gateway (docs/exec.md): the gate every tool call passes
(``service.py``), the requests with native buttons sent to the approvers
(``prompts.py``), and the control API routes behind ``tidegate approvals`` (``api.py``)."""
