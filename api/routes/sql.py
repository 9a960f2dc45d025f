"""``POST /v1/sql``: one SELECT over your views, a page at a time; ``GET /v1/sql/views``: what you can read."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Service, Tenant
from api.jsonable import table_rows
from api.models import Column, SqlRequest, SqlResponse, View, ViewList

router = APIRouter(prefix="/v1/sql", tags=["sql"])


@router.post("", response_model=SqlResponse)
def run_sql(body: SqlRequest, tenant: Tenant, service: Service) -> SqlResponse:
    """Run one read-only SELECT over your rows; ``limit``/``offset`` page through the result."""
    page = service.run_sql(tenant, body.sql, limit=body.limit, offset=body.offset)
    rows = page.table.num_rows
    return SqlResponse(
        columns=[Column(name=f.name, type=str(f.type)) for f in page.table.schema],
        rows=table_rows(page.table),
        row_count=rows,
        truncated=page.more,
        limit=service.pages.clamp(body.limit),
        offset=page.offset,
        next_offset=page.offset + rows if page.more else None,
    )


@router.get("/views", response_model=ViewList)
def list_views(tenant: Tenant, service: Service) -> ViewList:
    """The views (and their columns) your SQL can read."""
    views = service.views(tenant)
    return ViewList(views=[View(name=name, columns=[Column(name=c, type=t) for c, t in cols])
                           for name, cols in views.items()])
