"""``GET /v1/rollouts`` (your rollouts, filtered, paged) and ``GET /v1/rollouts/{id}`` (one, every step in order)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import Service, Tenant
from api.models import RolloutPage, Status
from store.trajectory import Trajectory

router = APIRouter(prefix="/v1/rollouts", tags=["rollouts"])


@router.get("", response_model=RolloutPage)
def list_rollouts(
    tenant: Tenant,
    service: Service,
    task_id: Annotated[str | None, Query(max_length=512)] = None,
    harness: Annotated[str | None, Query(max_length=512, description="NAME or NAME@VERSION")] = None,
    status: Status | None = None,
    limit: Annotated[int | None, Query(ge=0)] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> RolloutPage:
    """Your rollouts, newest first."""
    items, more = service.list_rollouts(tenant, task_id=task_id, harness=harness, status=status,
                                        limit=limit, offset=offset)
    return RolloutPage(items=items, limit=service.pages.clamp(limit), offset=offset,
                       next_offset=offset + len(items) if more else None)


@router.get("/{rollout_id}", response_model=Trajectory)
def get_rollout(tenant: Tenant, service: Service,
                rollout_id: Annotated[str, Path(min_length=1, max_length=512)]) -> Trajectory:
    """One of your rollouts: its summary and every step (start, LLM calls, tool steps, rewards, finish) in order."""
    return service.trajectory(tenant, rollout_id)
