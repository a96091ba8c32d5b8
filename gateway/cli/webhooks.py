"""``tidegate doctor``'s webhook checks: is each webhook secret there, is the endpoint
registered with the platform, and does it answer — and refuse an unsigned request.

- Telegram (``mode: webhook``): ``webhook_secret`` set; ``getWebhookInfo`` (Bot API) names
  the registered URL — none, or another than ``webhook_url`` (else ``public_base_url`` +
  ``webhook_path``), is an error; its ``last_error_message`` (Telegram could not deliver)
  and a large ``pending_update_count`` are warnings. Then the URL itself is probed: one
  POST with a wrong ``X-Telegram-Bot-Api-Secret-Token`` must be refused (401/403). In
  ``mode: polling`` a registered webhook is a warning (getUpdates answers 409 while it
  exists).
- Slack (``mode: http``): ``signing_secret`` set; Slack's Web API does not expose the
  Events Request URL, so the endpoint (``public_base_url`` + ``events_path``) is probed
  with an unsigned POST, which must be refused.
- WhatsApp: ``app_secret`` and ``verify_token`` set; the endpoint (``public_base_url`` +
  ``webhook_path``: the Callback URL of the Meta app) is probed with a POST carrying a
  wrong ``X-Hub-Signature-256``, which must be refused.

Findings are ``(severity, message, fix)``; secrets never appear in them.
"""

from __future__ import annotations

import json
import secrets
import time
import urllib.error
import urllib.request
from typing import Any

PENDING_WARN = 100
Result = tuple[str, str, str]  # severity, message, fix


def webhook_findings(loaded: Any) -> list[tuple[str, Result]]:
    """``[(account name, (severity, message, fix))]`` for every enabled account that
    uses (or must not have) a webhook."""
    from channels.sections import account_configs
    cfg = loaded.config
    base = (cfg.gateway.public_base_url or "").rstrip("/")
    out: list[tuple[str, Result]] = []
    for platform, check in (("telegram", _telegram), ("slack", _slack),
                            ("whatsapp", _whatsapp)):
        section = cfg.channels.platform(platform)
        if section is None or not section.enabled:
            continue
        for account, acc in account_configs(section).items():
            if not getattr(acc, "enabled", True):
                continue
            name = platform if account == "default" else f"{platform}:{account}"
            out += [(name, r) for r in check(acc, base)]
    return out


def _unset(value: str | None) -> bool:
    return not value or "${" in value


def _telegram(acc: Any, base: str) -> list[Result]:
    if _unset(acc.token):
        return []  # the channel check names the missing token
    info, err = _get_webhook_info(acc.api_base_url, acc.token)
    if info is None:
        return [("error", f"getWebhookInfo failed: {err}",
                 "check the token and channels.telegram.api_base_url")]
    registered = str(info.get("url") or "")
    if acc.mode == "polling":
        if not registered:
            return []
        return [("warning", (f"a webhook is registered ({registered}) while this account "
                 "polls: getUpdates answers 409 until it is deleted"),
                 ("the gateway deletes it at start; if another deployment uses this bot, "
                 "give each its own bot token"))]
    out: list[Result] = []
    if _unset(acc.webhook_secret):
        out.append(("error", "webhook_secret is not set: anyone could post updates",
                    ("set channels.telegram.webhook_secret (1-256 of A-Z a-z 0-9 _ -) in "
                    "the env file")))
    expected = acc.webhook_url or (f"{base}{acc.webhook_path}" if base else "")
    if not registered:
        out.append(("error", "Telegram has no webhook registered for this bot",
                    ("set channels.telegram.webhook_url (the gateway registers it at start) "
                    "or call setWebhook yourself")))
    elif expected and registered != expected:
        out.append(("error", f"Telegram delivers to {registered}, not {expected}",
                    ("restart the gateway to register webhook_url again (another deployment "
                    "may have changed it)")))
    else:
        out.append(("ok", f"registered with Telegram at {registered}", ""))
    if info.get("last_error_message"):
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC",
                             time.gmtime(int(info.get("last_error_date") or 0)))
        out.append(("warning", (f"Telegram's last delivery failed at {when}: "
                    f"{info['last_error_message']}"),
                    ("make the URL reachable from the internet over https (proxy, "
                    "certificate, firewall)")))
    pending = int(info.get("pending_update_count") or 0)
    if pending > PENDING_WARN:
        out.append(("warning", f"{pending} updates wait at Telegram",
                    "check that the gateway answers the webhook (tidegate logs)"))
    target = expected or registered
    if target:
        out.append(_probe(target, {"X-Telegram-Bot-Api-Secret-Token": _wrong_secret()},
                          "channels.telegram.webhook_path / webhook_url"))
    return out


def _slack(acc: Any, base: str) -> list[Result]:
    if acc.mode != "http":
        return []
    if _unset(acc.signing_secret):
        return [("error", "signing_secret is not set: requests cannot be verified",
                 "set channels.slack.signing_secret (Basic Information page of the app)")]
    if not base:
        return [("warning", ("cannot probe the Events endpoint: Slack's API does not show "
                 "the Request URL and gateway.public_base_url is not set"),
                 "set gateway.public_base_url to the https URL Slack posts to")]
    return [_probe(f"{base}{acc.events_path}",
                   {"X-Slack-Request-Timestamp": str(int(time.time())),
                    "X-Slack-Signature": "v0=" + "0" * 64},
                   "channels.slack.events_path / gateway.public_base_url")]


def _whatsapp(acc: Any, base: str) -> list[Result]:
    missing = [k for k in ("app_secret", "verify_token") if _unset(getattr(acc, k))]
    if missing:
        return [("error", f"{' and '.join(missing)} not set: webhooks cannot be verified",
                 ("set channels.whatsapp.app_secret (App settings -> Basic) and "
                  "verify_token in the env file"))]
    if not base:
        return [("warning", ("cannot probe the webhook: gateway.public_base_url (the host "
                 "of the Meta app's Callback URL) is not set"),
                 "set gateway.public_base_url to the https URL Meta calls")]
    return [_probe(f"{base}{acc.webhook_path}",
                   {"X-Hub-Signature-256": "sha256=" + "0" * 64},
                   "channels.whatsapp.webhook_path / gateway.public_base_url")]


def _wrong_secret() -> str:
    return "doctor-probe-" + secrets.token_hex(8)


def _get_webhook_info(api_base: str, token: str) -> tuple[dict | None, str]:
    url = f"{api_base.rstrip('/')}{token}/getWebhookInfo"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return None, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"unreachable: {getattr(exc, 'reason', exc)}"
    if not body.get("ok"):
        return None, str(body.get("description"))
    return body.get("result") or {}, ""


def _probe(url: str, headers: dict[str, str], where: str) -> Result:
    """POST a request with a wrong signature to ``url``: it must arrive and be refused."""
    req = urllib.request.Request(url, data=b"{}", method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (urllib.error.URLError, OSError) as exc:
        return ("error", f"{url} is not reachable ({getattr(exc, 'reason', exc)})",
                "start the gateway and check the URL, proxy and firewall")
    if status in (401, 403):
        return ("ok", f"{url} answers and refuses a request with a wrong signature", "")
    if 200 <= status < 300:
        return ("error", f"{url} accepted a request with a wrong signature",
                "the endpoint does not verify signatures: is it this gateway?")
    return ("error", f"{url} answered HTTP {status}, not this gateway's webhook",
            f"check {where}")
