"""Webhook signatures and delivery ids.

``github``: ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`` and
``X-GitHub-Delivery`` (GitHub's "Validating webhook deliveries"); ``hmac-sha256``: the
same HMAC in ``X-Signature-256`` (``sha256=`` optional) and ``X-Delivery-Id`` (or
``Idempotency-Key``). Comparison is constant-time; neither the secret nor the signature
is ever logged or returned.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

SIGNATURE_HEADER = {"github": "X-Hub-Signature-256", "hmac-sha256": "X-Signature-256"}
DELIVERY_HEADERS = {"github": ("X-GitHub-Delivery",),
                    "hmac-sha256": ("X-Delivery-Id", "Idempotency-Key"),
                    "none": ("X-Delivery-Id", "Idempotency-Key")}


def sign(secret: str, body: bytes) -> str:
    """``sha256=<hex>``: what a sender puts in the signature header."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def signature_ok(scheme: str, secret: str | None, headers: Mapping[str, str],
                 body: bytes) -> bool:
    """Whether ``body`` carries a valid signature under ``scheme`` (``none``: always)."""
    if scheme == "none":
        return True
    given = headers.get(SIGNATURE_HEADER[scheme], "").strip()
    if scheme == "hmac-sha256" and given and not given.startswith("sha256="):
        given = "sha256=" + given
    if not secret or not given.startswith("sha256="):
        return False
    return hmac.compare_digest(given.lower(), sign(secret, body))


def delivery_id(scheme: str, headers: Mapping[str, str], body: bytes) -> str:
    """The sender's id of this delivery (a retry or replay carries the same one); without
    one, the body's SHA-256, so a replayed body runs once too."""
    for name in DELIVERY_HEADERS[scheme]:
        value = headers.get(name, "").strip()
        if value:
            return value[:200]
    return "sha256:" + hashlib.sha256(body).hexdigest()
