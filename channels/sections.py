"""Platform sections with several accounts (``channels.<name>`` and its
``accounts.<id>``): :class:`PlatformSection`, the mixin every chat platform's config model
uses, builds the per-account model from the section's own fields, makes each account
inherit the section's keys it does not set, and checks every enabled account;
:func:`account_configs` lists the enabled accounts of a section.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from runtime.config_types import ConfigModel


def _accounts_with_inheritance(section: dict[str, Any],
                               known: Any = None) -> dict[str, Any]:
    """``section`` with each ``accounts.<id>`` holding the section's keys it does not set;
    with ``known`` (the account model's field names) only those are inherited, so a
    section-level unknown key is reported once, where it was written."""
    if "accounts" not in section:
        return section  # nothing to inherit; ``accounts`` stays unset (model_fields_set)
    base = {k: v for k, v in section.items()
            if k != "accounts" and (known is None or k in known)}
    accounts = section["accounts"] or {}
    if not isinstance(accounts, dict):
        return section
    merged = {aid: {**base, **(acc or {})} if isinstance(acc, dict) else acc
              for aid, acc in accounts.items()}
    return {**section, "accounts": merged}


def _declared(cls: type, key: str) -> bool:
    return any(key in vars(b).get("__annotations__", {}) for b in cls.__mro__)


def _no_problems(account: Any) -> list[str]:
    return []


class PlatformSection:
    """Shared behaviour of the platform sections: accounts inherit the section's keys,
    and every enabled account is checked (``_problems``) when the platform is enabled.

    A subclass that does not declare them gets ``enabled`` (bool, default False) and
    ``accounts`` (``{account_id: account model}``, default ``{}``), the account model
    being its pydantic bases plus the fields and validators the subclass declares
    itself, with ``enabled`` defaulting to True (``_account_model``);
    ``_problems(account) -> list[str]`` defaults to no problems."""

    _problems: Any = staticmethod(_no_problems)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # runs inside pydantic's metaclass before it collects the fields
        if not _declared(cls, "enabled"):
            cls.__annotations__ = {**vars(cls).get("__annotations__", {}), "enabled": bool}
            cls.enabled = Field(False, description="Connect this platform.")
        if not _declared(cls, "accounts"):
            cls.__account_model__ = _account_model(cls)
            cls.__annotations__ = {**vars(cls).get("__annotations__", {}),
                                   "accounts": dict[str, cls.__account_model__]}
            cls.accounts = Field({}, description=("Several accounts by id; each inherits "
                                                  "the keys it does not set."))
        super().__init_subclass__(**kwargs)

    @model_validator(mode="before")
    @classmethod
    def _inherit(cls, data: Any) -> Any:
        model = getattr(cls, "__account_model__", None)
        known = getattr(model, "model_fields", None) if model is not None else None
        return _accounts_with_inheritance(data, known) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _required(self) -> Any:
        if not self.enabled:
            return self
        items = self.accounts.items() if self.accounts else [("", self)]
        check = type(self)._problems or _no_problems
        problems = [f"accounts.{aid}.{p}" if aid else p for aid, acc in items
                    if getattr(acc, "enabled", True) for p in check(acc)]
        if problems:
            raise ValueError("\n".join(problems))
        return self


def _account_model(cls: type) -> type:
    """The account model of section ``cls``: its pydantic bases (for a base that is a
    section itself, that base's account model) plus the fields, validators and
    ``model_config`` the class declares itself, so that ``accounts.<id>`` has the
    plugin's typed keys; ``enabled`` defaults to True there (an account is on unless
    switched off). Called before pydantic builds ``cls``: ``vars(cls)`` is its body."""
    from pydantic import BaseModel
    bases = tuple(dict.fromkeys(
        getattr(b, "__account_model__", None) or _first_model_base(b)
        for b in cls.__bases__ if isinstance(b, type) and issubclass(b, BaseModel)))
    body = vars(cls)
    own = {k: v for k, v in body.get("__annotations__", {}).items()
           if k not in ("accounts", "enabled") and not k.startswith("_")}
    ns: dict[str, Any] = {"__module__": cls.__module__, "__annotations__": dict(own)}
    ns.update({k: body[k] for k in own if k in body})
    ns.update({k: v for k, v in body.items()  # field/model validators, the config
               if hasattr(v, "decorator_info") or k == "model_config"})
    bases = bases or (ConfigModel,)
    if not own and len(bases) == 1 and _declared(bases[0], "enabled"):
        return bases[0]
    if not any(_declared(b, "enabled") for b in bases) or _declared(cls, "enabled"):
        ns["__annotations__"]["enabled"] = bool
        ns["enabled"] = Field(True, description="Connect this account.")
    return type(f"{cls.__name__}Account", bases, ns)


def _first_model_base(cls: type) -> type:
    """The first pydantic model in ``cls``'s MRO that is not a section (ConfigModel)."""
    from pydantic import BaseModel
    return next((b for b in cls.__mro__ if isinstance(b, type) and issubclass(b, BaseModel)
                 and b is not BaseModel and not issubclass(b, PlatformSection)), ConfigModel)


def account_configs(section: Any) -> dict[str, Any]:
    """The enabled accounts of a platform section: ``{account_id: account_config}``.

    Without ``accounts`` the section itself is the single account ``default``; a section
    or account without ``enabled`` counts as enabled. None gives ``{}``.
    """
    if section is None or not getattr(section, "enabled", True):
        return {}
    accounts = getattr(section, "accounts", None)
    if not accounts:
        return {"default": section}
    return {aid: acc for aid, acc in accounts.items() if getattr(acc, "enabled", True)}
