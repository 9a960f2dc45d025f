"""Settings, read from TRAJLAKE_* environment variables (and CLI flags).

Each package owns a plain pydantic model of its options (``IngesterConfig``,
``GatewayConfig``, ``QueryApiConfig``, all extending ``schemas.options.CommonOptions``);
a command's settings class is that model plus ``CommonSettings``, so every
option is declared once. ``load`` builds one in the command's function (flags win over
the environment) and turns a bad value into one line naming the variable;
nothing here is instantiated at import time.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from pydantic_settings import SettingsError as SettingsSourceError

from schemas.errors import SettingsInvalid
from schemas.options import CommonOptions
from trajlake.plain_settings import SQL_MAX_ROWS, SQL_MAX_ROWS_CAP, open_lake

if TYPE_CHECKING:  # pyarrow and deltalake load when a command opens the lake, not at start-up
    from store.lake import Lake

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class ShellSettings(BaseSettings):
    """What the shell itself reads before any command runs: the log level and the home folder."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_", extra="ignore")

    log_level: str = "WARNING"
    """Level of trajlake's own logs (TRAJLAKE_LOG_LEVEL): DEBUG, INFO, WARNING or ERROR; DEBUG also turns on the
    libraries' logs and shows the traceback of an error (as --debug does)."""
    home: Path = Field(default_factory=lambda: Path.home() / ".cache" / "trajlake")
    """Folder of trajlake's caches, e.g. the tiny demo model (TRAJLAKE_HOME)."""

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        if not isinstance(logging.getLevelName(value.upper()), int):
            raise ValueError(f"{value!r}: use {', '.join(LOG_LEVELS)}")
        return value.upper()


def _object_store_env() -> dict[str, str]:
    from store.storage import object_store_env

    return object_store_env(os.environ)


class CommonSettings(ShellSettings, CommonOptions):
    """Where the lake and the broker are, its object store, lineage. Every command's settings extend these."""

    object_store: dict[str, str] = Field(default_factory=_object_store_env, repr=False)
    """The object-store variables (AWS_*, AZURE_*, GOOGLE_*, TRAJLAKE_AWS_CREDENTIAL_CHAIN), read once: an
    s3:// lake's credentials, region and endpoint (``store.storage``)."""
    openlineage_transport: str = "none"
    """Where OpenLineage run events go: none, http (Marquez-compatible), file or console."""
    openlineage_url: str | None = None
    """Lineage server for the http transport, e.g. http://marquez:5000."""
    openlineage_endpoint: str = "api/v1/lineage"
    openlineage_api_key: str | None = None
    """Bearer key for the http transport, when the server wants one."""
    openlineage_file: str | None = None
    """File of the file transport (one JSON event per line, appended)."""
    openlineage_namespace: str = "trajlake"
    """Namespace of trajlake's jobs in the lineage server."""

    def open_lake(self) -> Lake:
        """The lake at ``lake`` with the object-store options of these settings.

        ``CredentialsMissing`` (exit 2) for an S3 lake without keys (see ``store.storage``).
        """
        return open_lake(self.lake, self.object_store)


class SqlSettings(CommonSettings):
    """Settings of ``trajlake sql`` (read without pydantic when plainly valid: ``trajlake.plain_settings``)."""

    sql_max_rows: int = Field(SQL_MAX_ROWS, ge=0, le=SQL_MAX_ROWS_CAP)
    """Rows the table format prints when --max-rows is not given (TRAJLAKE_SQL_MAX_ROWS)."""


S = TypeVar("S", bound=BaseSettings)


def load(settings: type[S], **flags: object) -> S:
    """``settings`` from the environment, with the flags that were given (None: not given) on top.

    A value that does not parse is a ``SettingsInvalid`` (exit 2) naming the variable, e.g.
    ``TRAJLAKE_SCHEDULER_LAG_H: Input should be greater than or equal to 0``.
    """
    try:
        return settings(**{k: v for k, v in flags.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        given = flags.get(name)
        where = f"{name} {given!r}" if given is not None else f"{name} ({settings.model_config.get('env_prefix', '')}{name.upper()})"
        field = settings.model_fields.get(name)
        shape = " (a JSON object, e.g. '{\"acme\": 30}')" if field is not None and _is_dict(field.annotation) else ""
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise SettingsInvalid(f"{where}: {first['msg']}{shape}{more}") from None
    except SettingsSourceError as exc:  # a JSON-valued variable that is not JSON
        raise SettingsInvalid(f"{exc}: write it as JSON, e.g. a JSON object '{{\"acme\": 30}}'") from None


def _is_dict(annotation: object) -> bool:
    return annotation is dict or getattr(annotation, "__origin__", None) is dict
