"""Config model of ``channels.whatsapp`` (the WhatsApp Cloud API channel).

One account is one WhatsApp Business phone number (``phone_number_id``) of a Meta app;
several live under ``accounts.<id>`` and inherit the section's keys. The access token,
app secret and verify token are secrets: write them as ``${VAR}`` references.
"""

import re
from typing import Any

from pydantic import Field, model_validator

from channels.sdk import AccountConfig, ConfigModel, Duration, IdStr, PlatformSection

GRAPH_VERSION = re.compile(r"v\d+\.\d+")


class WindowTemplate(ConfigModel):
    """``window_template``: the approved message template sent instead of a reply that
    falls outside the 24-hour customer service window (Cloud API ``type: template``)."""

    name: str = Field(
        ...,
        description="The template's name as approved in WhatsApp Manager (e.g. reopen_chat).")
    language: str = Field(
        "en_US",
        description="The template's language code (e.g. en_US, de).")
    components: list[dict[str, Any]] = Field(
        [],
        description=("Template components sent as written (header/body parameters); [] for a "
                     "template without variables."))


class WhatsAppAccount(AccountConfig):
    enabled: bool = Field(
        True,
        description="Connect this account.")
    access_token: str | None = Field(
        None,
        description=("A system-user access token with whatsapp_business_messaging (keep it in the "
                     "environment: ${WHATSAPP_ACCESS_TOKEN})."))
    phone_number_id: IdStr | None = Field(
        None,
        description="The business phone number's id (WhatsApp Manager → API Setup), not the number.")
    app_secret: str | None = Field(
        None,
        description=("The Meta app's secret (App settings → Basic): every webhook POST must carry "
                     "a matching X-Hub-Signature-256 (else 401)."))
    verify_token: str | None = Field(
        None,
        description=("Any string you choose; typed into the app's webhook settings, answered by the "
                     "hub.challenge handshake."))
    webhook_path: str = Field(
        "/whatsapp/webhook",
        description="The webhook path mounted on the gateway's HTTP server (one per account).")
    api_base_url: str = Field(
        "https://graph.facebook.com",
        description="Graph API base URL (only for a proxy or tests).")
    api_version: str = Field(
        "v21.0",
        description="Graph API version used in every request path (vNN.N).")
    send_timeout: Duration = Field(
        30.0,
        description="HTTP timeout of each Graph API call.")
    unhealthy_after: Duration = Field(
        120.0,
        description=("Graph API unreachable this long: one ERROR with the likely cause, "
                     "status.problems, /readyz 503."))
    window_template: WindowTemplate | None = Field(
        None,
        description=("Sent instead of a reply outside the 24-hour window; null = the reply is refused"
                     " (logged, recorded as its outcome)."))
    read_receipts: bool = Field(
        False,
        description=("Mark each message read (blue ticks) and show the typing indicator while its "
                     "turn runs."))
    window_hours: float = Field(
        24.0, gt=0, le=24.0,
        description=("Customer service window in hours since the user's last message (Meta's rule: "
                     "24; lower it to keep a margin)."))
    allow_from: list[IdStr] = Field(
        [],
        description="WhatsApp ids (phone numbers in international form without +) (\"*\" = everyone).")


def _whatsapp_problems(acc: Any) -> list[str]:
    out = [f"{key}: required when whatsapp is enabled"
           for key in ("access_token", "phone_number_id", "app_secret", "verify_token")
           if not getattr(acc, key)]
    if not GRAPH_VERSION.fullmatch(acc.api_version or ""):
        out.append(f"api_version: {acc.api_version!r} is not a Graph API version like v21.0")
    if not acc.webhook_path.startswith("/"):
        out.append("webhook_path: must start with /")
    return out


class WhatsAppChannelConfig(PlatformSection, WhatsAppAccount):
    enabled: bool = Field(False, description="connect this platform (its accounts, or the one account of the section itself).")
    accounts: dict[str, WhatsAppAccount] = Field(
        {},
        description=("Several phone numbers: {<account_id>: {phone_number_id: ..., webhook_path: ..., "
                     "any key above}}; each inherits the keys it does not set."))
    _problems = staticmethod(_whatsapp_problems)

    @model_validator(mode="after")
    def _distinct_paths(self) -> "WhatsAppChannelConfig":
        paths = [acc.webhook_path for acc in self.accounts.values() if acc.enabled]
        doubled = sorted({p for p in paths if paths.count(p) > 1})
        if self.enabled and doubled:
            raise ValueError(f"accounts: webhook_path {doubled[0]!r} is used by several "
                             "accounts; give each account its own webhook_path")
        return self
