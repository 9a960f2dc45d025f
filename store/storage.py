"""Object-store settings for every reader and writer of the lake, built in one place.

Local lakes need none. An ``s3://`` lake reads the standard ``AWS_*``
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ENDPOINT_URL`` for MinIO and
other S3-compatible servers, ``AWS_ALLOW_HTTP=true`` for a plain-http
endpoint). ``storage_options`` turns them into delta-rs options (Polars'
``read_delta``/``scan_delta`` take the same dict); ``arrow_filesystem`` and
``duckdb_secret`` derive the pyarrow filesystem and DuckDB's ``httpfs``
secret from those options, so the three engines can never disagree.

Unless a DynamoDB locking provider is configured, S3 lakes ask for
conditional puts (``aws_conditional_put=etag``): MinIO, R2 and S3 itself
refuse to overwrite an existing Delta log entry, which is what makes
concurrent writers (two schedulers, several ingesters) safe without an
external lock. With keys given, nothing reaches for the cloud's instance
metadata. Without keys an S3 lake is refused (``CredentialsMissing``, one
line naming the settings) unless ``TRAJLAKE_AWS_CREDENTIAL_CHAIN=true`` asks
delta-rs, DuckDB and pyarrow to use the AWS credential chain (profiles, web
identity, and the instance metadata address).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from schemas.errors import EXIT_BAD_SETTINGS, SettingsInvalid, Unreachable

if TYPE_CHECKING:  # pyarrow loads when a filesystem is built: a local ``trajlake sql`` never needs one
    import pyarrow.fs as pafs

_OBJECT_STORE_PREFIXES = ("AWS_", "AZURE_", "GOOGLE_")
CREDENTIAL_CHAIN = "TRAJLAKE_AWS_CREDENTIAL_CHAIN"
"""``true``: an S3 lake without keys may use the AWS credential chain (which can ask the instance metadata)."""


class StoreUnreachable(Unreachable):
    """The lake's object store does not answer, refuses the credentials, or lacks the bucket."""


class CredentialsMissing(StoreUnreachable):
    """An S3 lake without keys, and the credential chain (instance metadata) not asked for."""

    exit_code = EXIT_BAD_SETTINGS


LAKE_SCHEMES = ("file://", "s3://", "s3a://")
"""The URI schemes a lake root may have (a root without ``://`` is a folder): every reader and writer here builds
a local or an S3 filesystem; another scheme (gs://, az://) would reach a library that can wait for minutes on
credentials it cannot find, or fail with its own words."""


def check_root(root: str) -> None:
    """``SettingsInvalid`` (exit 2) unless ``root`` is a folder, ``file://...`` or ``s3://bucket/prefix``: checked
    before any filesystem is built.

    >>> check_root("gs://b/lake")
    Traceback (most recent call last):
    schemas.errors.SettingsInvalid: lake 'gs://b/lake': a lake is a folder or s3://bucket/prefix (gs:// is not supported); check --lake / TRAJLAKE_LAKE
    """
    if not root.strip():
        raise SettingsInvalid("the lake root is empty: give --lake / TRAJLAKE_LAKE a folder or s3://bucket/prefix")
    if "://" in root and not root.startswith(LAKE_SCHEMES):
        scheme = root.split("://", 1)[0]
        raise SettingsInvalid(f"lake {root!r}: a lake is a folder or s3://bucket/prefix ({scheme}:// is not "
                              "supported); check --lake / TRAJLAKE_LAKE")


def is_local(root: str) -> bool:
    """True for a folder (or ``file://``) lake root."""
    return "://" not in root or root.startswith("file://")


def object_store_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that configure object stores (``AWS_*``, ``AZURE_*``, ``GOOGLE_*`` and
    ``TRAJLAKE_AWS_CREDENTIAL_CHAIN``): what ``storage_options`` reads.

    >>> object_store_env({"AWS_REGION": "eu-west-1", "HOME": "/root"})
    {'AWS_REGION': 'eu-west-1'}
    """
    return {key: value for key, value in env.items() if key.startswith(_OBJECT_STORE_PREFIXES) or key == CREDENTIAL_CHAIN}


def storage_options(root: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """delta-rs storage options for the lake at ``root``.

    >>> storage_options("./lake", {"AWS_REGION": "eu-west-1"})
    {}
    >>> storage_options("s3://b/lake", {"AWS_REGION": "eu-west-1", "TRAJLAKE_AWS_CREDENTIAL_CHAIN": "true"})
    {'AWS_REGION': 'eu-west-1', 'aws_conditional_put': 'etag'}

    Raises ``CredentialsMissing`` for an S3 lake with neither keys nor ``TRAJLAKE_AWS_CREDENTIAL_CHAIN=true``, and
    ``SettingsInvalid`` for a root ``check_root`` refuses.
    """
    check_root(root)
    if is_local(root):
        return {}
    env = os.environ if env is None else env
    options = {key: value for key, value in env.items() if key.startswith(_OBJECT_STORE_PREFIXES)}
    if root.startswith(("s3://", "s3a://")):
        keys = _option(options, "AWS_ACCESS_KEY_ID") and _option(options, "AWS_SECRET_ACCESS_KEY")
        if not keys and env.get(CREDENTIAL_CHAIN, "").strip().lower() not in ("1", "true", "yes"):
            raise CredentialsMissing(
                f"lake {root} is on S3 but AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set: set them, or set "
                f"{CREDENTIAL_CHAIN}=true to use the AWS credential chain (profiles, instance metadata)")
        if "AWS_S3_LOCKING_PROVIDER" not in options:
            options.setdefault("aws_conditional_put", "etag")
    return options


def _option(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {key.lower(): value for key, value in options.items()}
    for name in names:
        if lowered.get(name.lower()):
            return lowered[name.lower()]
    return None


def s3_endpoint(options: Mapping[str, str]) -> str | None:
    """The custom S3 endpoint URL of ``options`` (None for AWS itself)."""
    return _option(options, "AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3")


def _region(options: Mapping[str, str]) -> str:
    return _option(options, "AWS_REGION", "AWS_DEFAULT_REGION") or "us-east-1"


def arrow_filesystem(root: str, options: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for ``root`` and the path of ``root`` on it.

    >>> arrow_filesystem("/tmp/lake", {})[1]
    '/tmp/lake'
    """
    import pyarrow.fs as pafs

    if is_local(root):
        return pafs.LocalFileSystem(), root.removeprefix("file://")
    if not root.startswith(("s3://", "s3a://")):
        return pafs.FileSystem.from_uri(root)
    endpoint = s3_endpoint(options)
    parsed = urlparse(endpoint) if endpoint else None
    filesystem = pafs.S3FileSystem(
        access_key=_option(options, "AWS_ACCESS_KEY_ID"),
        secret_key=_option(options, "AWS_SECRET_ACCESS_KEY"),
        session_token=_option(options, "AWS_SESSION_TOKEN"),
        region=_region(options),
        endpoint_override=parsed.netloc if parsed else None,
        scheme=parsed.scheme if parsed else "https",
        allow_bucket_creation=False,
        allow_bucket_deletion=False,
        connect_timeout=5,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=2),
    )
    return filesystem, root.split("://", 1)[1].rstrip("/")


def duckdb_secret(root: str, options: Mapping[str, str]) -> str | None:
    """``CREATE SECRET`` SQL that gives DuckDB's httpfs (and delta_scan) the same S3 settings.

    None for a local lake. With keys, the secret carries them (DuckDB never
    asks the instance metadata address); without, it uses the credential chain.

    >>> duckdb_secret("/tmp/lake", {}) is None
    True
    """
    if is_local(root) or not root.startswith(("s3://", "s3a://")):
        return None
    parts = ["TYPE s3", f"REGION {_sql(_region(options))}"]
    key, secret = _option(options, "AWS_ACCESS_KEY_ID"), _option(options, "AWS_SECRET_ACCESS_KEY")
    if key and secret:
        parts += [f"KEY_ID {_sql(key)}", f"SECRET {_sql(secret)}"]
        if token := _option(options, "AWS_SESSION_TOKEN"):
            parts.append(f"SESSION_TOKEN {_sql(token)}")
    else:
        parts.append("PROVIDER credential_chain")
    if endpoint := s3_endpoint(options):
        parsed = urlparse(endpoint)
        parts += [f"ENDPOINT {_sql(parsed.netloc)}", "URL_STYLE 'path'",
                  f"USE_SSL {'true' if parsed.scheme == 'https' else 'false'}"]
    return f"CREATE OR REPLACE SECRET trajlake_lake ({', '.join(parts)})"




def store_problem(root: str, options: Mapping[str, str]) -> str | None:
    """None when the object store of the lake at ``root`` answers; else one line naming the setting to fix.

    Used after a command failed, to turn whatever the engine raised (a Rust
    error chain, an AWS SDK message) into what the user has to change.
    """
    if is_local(root) or not root.startswith(("s3://", "s3a://")):
        return None
    import pyarrow.fs as pafs

    endpoint = s3_endpoint(options) or "the AWS default endpoint"
    filesystem, path = arrow_filesystem(root, options)
    bucket = path.split("/", 1)[0]
    try:
        found = filesystem.get_file_info(bucket).type != pafs.FileType.NotFound
    except OSError as e:
        text = str(e)
        if any(s in text for s in ("NETWORK_CONNECTION", "Could not connect", "Couldn't resolve", "curlCode")):
            return (f"cannot reach the object store at {endpoint}: check AWS_ENDPOINT_URL (a plain-http server "
                    "also needs AWS_ALLOW_HTTP=true) and that the server is up")
        if any(s in text for s in ("ACCESS_DENIED", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                                   "403", "INVALID_ACCESS_KEY")):
            return (f"the object store at {endpoint} refused the credentials: check AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY (and AWS_REGION)")
        return f"object store at {endpoint} failed: {text.splitlines()[0]} (check the AWS_* settings)"
    if not found:
        return (f"bucket {bucket!r} does not exist at {endpoint}: create it, or fix the lake root "
                "(--lake / TRAJLAKE_LAKE) or AWS_ENDPOINT_URL")
    return None


def _sql(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
