"""``GET /v1/lineage/{id}``: what a dataset version, checkpoint, rollout or event came from and what used it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import Service, Tenant
from api.models import CheckpointUse, DatasetUse, EventRef, LineageOut, OffsetRange

router = APIRouter(prefix="/v1/lineage", tags=["lineage"])


@router.get("/{ref}", response_model=LineageOut)
def get_lineage(
    tenant: Tenant,
    service: Service,
    ref: Annotated[str, Path(min_length=1, max_length=512,
                             description="NAME@VERSION, checkpoint, rollout or event id")],
    limit: Annotated[int | None, Query(ge=0, description="Events per page")] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
) -> LineageOut:
    """Lineage in both directions, limited to your rows and the datasets built for you alone."""
    found = service.lineage(tenant, ref)
    limit = service.pages.clamp(limit)
    n_events = 0 if found.events is None else found.events.num_rows
    page = [] if found.events is None else found.events.slice(offset, limit).to_pylist()
    return LineageOut(
        kind=found.kind,
        subject=found.subject,
        datasets=[DatasetUse(dataset=u.dataset, version=u.version, used_event=u.used_event) for u in found.datasets],
        checkpoints=[CheckpointUse(checkpoint_id=c.checkpoint_id, dataset=c.dataset, version=c.version)
                     for c in found.checkpoints],
        rollouts=found.rollouts,
        sources=found.sources,
        offset_ranges=[OffsetRange(**r) for r in found.offset_ranges()],
        n_events=n_events,
        events=[EventRef(**e) for e in page],
        limit=limit,
        offset=offset,
        next_offset=offset + len(page) if offset + len(page) < n_events else None,
    )
