"""The query API: read-only SQL over a tenant's rows, rollouts, datasets and lineage (FastAPI).

>>> from pipelines.api import create_query_app  # doctest: +SKIP
>>> app = create_query_app(settings, keys=key_ring)  # doctest: +SKIP
"""

from pipelines.api.app import create_query_app
from pipelines.api.auth import TenantKeys
from pipelines.api.config import QueryApiConfig
from pipelines.api.services import QueryService

__all__ = ["QueryApiConfig", "QueryService", "TenantKeys", "create_query_app"]
