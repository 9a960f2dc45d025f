"""The trajectory viewer: three pages under ``/viewer`` and the JSON they read under ``/v1/viewer``.

Auth in the browser: the pages are static shells that hold no data, so they
are served without a key. Each page asks for the API key once per browser
tab, keeps it in ``sessionStorage`` (gone when the tab closes; never in a
URL, a cookie or server logs) and sends it as ``Authorization: Bearer`` on
every ``fetch`` of the JSON endpoints, which authenticate like the rest of
the API and return the key's tenant only. Because no cookie carries the key,
other sites cannot make the browser call the API with it (no CSRF), and the
pages' Content-Security-Policy allows only this origin's scripts, so
injected text cannot run. Assets are local files (no CDN).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path as PathParam, Query
from fastapi.responses import FileResponse

from api.deps import Decoder, Service, Tenant
from api.models import Status
from api.viewer import STATIC_DIR
from api.viewer.models import Facets, RolloutDetail, RolloutRows, SuccessChart
from api.viewer.service import RolloutFilter, facets, list_rollouts, rollout_detail
from api.viewer.stats import Bucket, success_chart

PAGE_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

router = APIRouter(tags=["viewer"])


def _page(file: str) -> FileResponse:
    return FileResponse(STATIC_DIR / file, media_type="text/html", headers=PAGE_HEADERS)


@router.get("/viewer", include_in_schema=False)
def rollouts_page() -> FileResponse:
    """The rollout list (filters: task, harness, status, reward)."""
    return _page("rollouts.html")


@router.get("/viewer/rollout", include_in_schema=False)
def rollout_page() -> FileResponse:
    """One rollout (``?id=ROLLOUT_ID``): timeline and token view."""
    return _page("rollout.html")


@router.get("/viewer/success", include_in_schema=False)
def success_page() -> FileResponse:
    """Success rate by harness version over time."""
    return _page("success.html")


@router.get("/v1/viewer/rollouts", response_model=RolloutRows)
def viewer_rollouts(
    tenant: Tenant,
    service: Service,
    task_id: Annotated[str | None, Query(max_length=512)] = None,
    harness: Annotated[str | None, Query(max_length=512, description="NAME or NAME@VERSION")] = None,
    status: Status | None = None,
    min_reward: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    max_reward: Annotated[float | None, Query(allow_inf_nan=False)] = None,
    limit: Annotated[int | None, Query(ge=0)] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> RolloutRows:
    """Your rollouts for the list page, newest first, filtered by task, harness, status and reward range."""
    wanted = RolloutFilter(task_id=task_id, harness=harness, status=status, min_reward=min_reward,
                           max_reward=max_reward)
    return list_rollouts(service, tenant, wanted, limit=limit, offset=offset)


@router.get("/v1/viewer/facets", response_model=Facets)
def viewer_facets(tenant: Tenant, service: Service) -> Facets:
    """The harness versions and statuses your rollouts have."""
    return facets(service, tenant)


@router.get("/v1/viewer/rollouts/{rollout_id}", response_model=RolloutDetail)
def viewer_rollout(tenant: Tenant, service: Service, decoder: Decoder,
                   rollout_id: Annotated[str, PathParam(min_length=1, max_length=512)]) -> RolloutDetail:
    """One of your rollouts: steps, full call and tool text, and the token view."""
    return rollout_detail(service, tenant, rollout_id, decoder)


@router.get("/v1/viewer/success-rate", response_model=SuccessChart)
def viewer_success_rate(
    tenant: Tenant,
    service: Service,
    harness: Annotated[str | None, Query(min_length=1, max_length=512, description="one harness NAME")] = None,
    bucket: Bucket = "auto",
    confidence: Annotated[float, Query(ge=0.5, le=0.999)] = 0.95,
) -> SuccessChart:
    """Success rate per harness version and hour/day of your ended rollouts, with Wilson intervals."""
    return success_chart(service, tenant, harness=harness, bucket=bucket, confidence=confidence)
