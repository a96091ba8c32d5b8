"""``tools.web`` config (issue 12). Every key has its default here."""


from typing import Literal

from pydantic import Field

from runtime.config_types import ConfigModel, Duration, section


class FetchSettings(ConfigModel):
    enabled: bool = Field(
        True,
        description="Offer web_fetch.")
    timeout: Duration = Field(
        20.0,
        description="Timeout of one fetch, redirects included.")
    max_bytes: int = Field(2 * 1024 * 1024, ge=1024,
        description="response body cap (2 MB)")  # response body cap
    max_chars: int = Field(50_000, ge=100,
        description="text returned to the model (the model may ask for less)")  # default cap of the returned text
    max_redirects: int = Field(5, ge=0, le=20,
        description="every hop is re-checked by the SSRF guard.")
    allow_private: bool = Field(
        False,
        description="true lets fetches reach loopback, private, link-local and metadata addresses.")  # True lets fetches reach loopback/private/link-local
    allow_hosts: list[str] = Field(
        [],
        description=("trusted intranet hosts exempt from the address check: \"wiki.lan\" or "
                     "\"10.0.0.5:8080\"."))  # "host" or "host:port" trusted
    cache_ttl: Duration = Field(
        900.0,
        description="How long a fetched page is reused.")
    user_agent: str = Field(
        "tidegate-web-fetch/0.1 (+https://github.com/)",
        description="The User-Agent header of fetches.")


class ProviderKey(ConfigModel):
    api_key: str | None = Field(
        None,
        description="The provider's API key (keep it in the environment).")
    base_url: str | None = Field(
        None,
        description="The provider's base URL; null = its public API.")


class SearchSettings(ConfigModel):
    enabled: bool = Field(
        True,
        description="Offer web_search (when a provider is configured).")
    provider: Literal["brave", "searxng", "tavily"] | None = Field(
        None,
        description=("brave | searxng | tavily; null = the first configured of brave, tavily, "
                     "searxng."))  # None: by which key is set
    count: int = Field(5, ge=1, le=20,
        description="default number of results (1-20)")
    timeout: Duration = Field(
        15.0,
        description="Timeout of one search request.")
    cache_ttl: Duration = Field(
        900.0,
        description="How long a search result is reused.")
    brave: ProviderKey = Field(
        section(),
        description="${BRAVE_API_KEY}; base_url default https://api.search.brave.com.")
    searxng: ProviderKey = Field(
        section(),
        description="base_url of your instance (JSON format enabled); api_key: optional bearer.")
    tavily: ProviderKey = Field(
        section(),
        description="${TAVILY_API_KEY}; base_url default https://api.tavily.com.")


class WebSettings(ConfigModel):
    fetch: FetchSettings = Field(
        section(),
        description="web_fetch(url, max_chars?)")
    search: SearchSettings = Field(
        section(),
        description="web_search(query, count?)")
