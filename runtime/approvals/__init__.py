"""Exec approvals (docs/exec.md): which commands run without asking (argv matching against
the allowlist and the stored "always allow" patterns), and the approval requests that
survive a restart (``store.py``). The gateway sends the requests to the approvers and takes
their answers (gateway/approvals/)."""
