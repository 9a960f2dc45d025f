"""API keys -> tenants. The tenant of every recorded event comes from here, never from a body.

Keys come from ``TRAJLAKE_GATEWAY_KEYS`` (``key1=tenantA,key2=tenantB``)
and/or a keys file (one ``key=tenant`` per line, ``#`` comments). Keys are
held as sha256 digests so that a lookup does not compare secrets byte by byte.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from schemas.errors import SettingsInvalid

ANONYMOUS_TENANT = "default"
"""Tenant of every call when ``allow_anonymous`` is on (development only)."""


class KeyConfigError(SettingsInvalid):
    """The keys configuration cannot be parsed or is empty."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def parse_keys(text: str, *, source: str) -> dict[str, str]:
    """``key=tenant`` pairs separated by commas or newlines -> {key: tenant}."""
    keys: dict[str, str] = {}
    for n, item in enumerate(text.replace("\n", ",").split(","), start=1):
        item = item.split("#", 1)[0].strip()
        if not item:
            continue
        key, sep, tenant = (part.strip() for part in item.partition("="))
        if not sep or not key or not tenant:
            raise KeyConfigError(f"{source}: entry {n} is not key=tenant (got {item[:4]}...)")
        if len(tenant) > 200:
            raise KeyConfigError(f"{source}: entry {n}: tenant names are at most 200 characters")
        keys[key] = tenant
    return keys


class KeyRing:
    """Maps a presented API key to its tenant.

    >>> KeyRing({"sk-a": "acme"}).tenant("sk-a")
    'acme'
    """

    def __init__(self, keys: dict[str, str], *, allow_anonymous: bool = False) -> None:
        if not keys and not allow_anonymous:
            raise KeyConfigError(
                "no gateway API keys configured: set TRAJLAKE_GATEWAY_KEYS=key=tenant,... or "
                "TRAJLAKE_GATEWAY_KEYS_FILE, or TRAJLAKE_ALLOW_ANONYMOUS=true for local development"
            )
        self._tenants = {_digest(k): t for k, t in keys.items()}
        self.allow_anonymous = allow_anonymous

    @classmethod
    def load(cls, *, env_value: str | None, file: Path | None, allow_anonymous: bool,
             setting: str = "TRAJLAKE_GATEWAY_KEYS") -> KeyRing:
        """The keys of ``file`` and ``env_value`` (the variable ``setting``, named in the errors)."""
        keys: dict[str, str] = {}
        if file is not None:
            try:
                keys.update(parse_keys(Path(file).read_text(), source=str(file)))
            except OSError as exc:
                raise KeyConfigError(f"cannot read keys file {file}: {exc.strerror}") from None
        if env_value:
            keys.update(parse_keys(env_value, source=setting))
        if not keys and not allow_anonymous and setting != "TRAJLAKE_GATEWAY_KEYS":
            raise KeyConfigError(f"no API keys configured: set {setting}=key=tenant,... or {setting}_FILE")
        return cls(keys, allow_anonymous=allow_anonymous)

    def tenant(self, key: str | None) -> str | None:
        """The key's tenant; None for a missing or unknown key (unless anonymous is allowed)."""
        if key:
            tenant = self._tenants.get(_digest(key))
            if tenant is not None:
                return tenant
        return ANONYMOUS_TENANT if self.allow_anonymous else None


def bearer_token(authorization: str | None, api_key_header: str | None = None) -> str | None:
    """The key from ``Authorization: Bearer <key>`` (what OpenAI clients send) or ``X-Api-Key``."""
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    return api_key_header or None
