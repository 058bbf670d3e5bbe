"""Which of the client's request headers travel on to the replica.

Everything the client sent goes on (``user-agent``, ``traceparent``, custom
``x-...`` headers, ``openai-*``...), except:

* hop-by-hop headers (RFC 9110 §7.6.1): ``connection``, ``keep-alive``,
  ``proxy-connection``, ``te``, ``transfer-encoding``, ``upgrade``,
  ``trailer``, and every header the ``Connection`` header names;
* ``host`` and ``content-length`` (the backend's HTTP client sets them for
  its own connection and the body it sends, which may differ: the gateway
  adds ``model`` when the client left it out);
* ``x-request-id``: the gateway sets it (the client's own value, else one it
  made up) so the replica's id and the gateway's agree;
* the gateway's own secrets (:func:`is_gateway_secret`).

Then the backend drops ``accept-encoding`` (the gateway reads answers, so it
asks for them plain) and puts its replica's ``api_key``, when it has one, in
``authorization`` (``engine.backends.base.outgoing_headers``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gateway.auth.keys import CLIENT_KEY_HEADERS
from gateway.config import Settings

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "te",
                        "transfer-encoding", "upgrade", "trailer"})
SET_BY_GATEWAY = frozenset({"host", "content-length", "x-request-id"})

SecretTest = Callable[[str], bool]
"""``is_secret(lower_case_header_name)``: the gateway's own credential, never forwarded."""


def client_keys_configured(settings: Settings) -> bool:
    """Whether the gateway checks client API keys of its own (``api_keys``,
    ``gateway.auth.keys``): then the client's key is the gateway's secret, not the
    replica's."""
    return settings.api_keys is not None


def is_gateway_secret(name: str, settings: Settings) -> bool:
    """Whether the request header ``name`` (lower case) is the gateway's own secret.

    ``proxy-authorization`` always is (it is meant for the proxy in front).
    The client's key headers (``authorization``, ``x-api-key``:
    ``gateway.auth.keys.CLIENT_KEY_HEADERS``) are when the gateway has client API
    keys of its own; otherwise they are forwarded, and the replica checks
    them (a replica configured with an ``api_key`` gets that key instead).
    Any other header the gateway comes to read a secret from belongs here.
    """
    if name == "proxy-authorization":
        return True
    return name in CLIENT_KEY_HEADERS and client_keys_configured(settings)


def secret_test(settings: Settings) -> SecretTest:
    return lambda name: is_gateway_secret(name, settings)


def forward_headers(headers: Mapping[str, str], is_secret: SecretTest) -> dict[str, str]:
    """The client's headers that go on to the replica (names in lower case)."""
    named = {token.strip().lower() for value in _values(headers, "connection")
             for token in value.split(",") if token.strip()}
    out: dict[str, str] = {}
    for name, value in headers.items():
        lower = name.lower()
        if (lower in HOP_BY_HOP or lower in SET_BY_GATEWAY or lower in named
                or is_secret(lower)):
            continue
        out[lower] = value
    return out


def _values(headers: Mapping[str, str], name: str) -> list[str]:
    getlist = getattr(headers, "getlist", None)
    if getlist is not None:  # Starlette's Headers: every occurrence
        return list(getlist(name))
    return [value for key, value in headers.items() if key.lower() == name]
