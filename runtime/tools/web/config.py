"""``tools.web`` config (issue 12). Every key has its default here."""


from typing import Literal

from pydantic import Field

from runtime.config_types import ConfigModel, Duration, section


class FetchSettings(ConfigModel):
    enabled: bool = True
    timeout: Duration = 20.0
    max_bytes: int = Field(2 * 1024 * 1024, ge=1024)  # response body cap
    max_chars: int = Field(50_000, ge=100)  # default cap of the returned text
    max_redirects: int = Field(5, ge=0, le=20)
    allow_private: bool = False  # True lets fetches reach loopback/private/link-local
    allow_hosts: list[str] = []  # "host" or "host:port" trusted
    cache_ttl: Duration = 900.0
    user_agent: str = "tidegate-web-fetch/0.1 (+https://github.com/)"


class ProviderKey(ConfigModel):
    api_key: str | None = None
    base_url: str | None = None


class SearchSettings(ConfigModel):
    enabled: bool = True
    provider: Literal["brave", "searxng", "tavily"] | None = None  # None: by which key is set
    count: int = Field(5, ge=1, le=20)
    timeout: Duration = 15.0
    cache_ttl: Duration = 900.0
    brave: ProviderKey = section()
    searxng: ProviderKey = section()
    tavily: ProviderKey = section()


class WebSettings(ConfigModel):
    fetch: FetchSettings = section()
    search: SearchSettings = section()
