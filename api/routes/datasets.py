"""``GET /v1/datasets`` and ``GET /v1/datasets/{name}``: dataset versions built from your rollouts only."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from api.deps import Service, Tenant
from api.models import Dataset, DatasetDetail, DatasetList, DatasetVersion
from api.visibility import VisibleVersion

router = APIRouter(prefix="/v1/datasets", tags=["datasets"])


def _version(v: VisibleVersion) -> DatasetVersion:
    return DatasetVersion.model_validate({**{k: v.row[k] for k in DatasetVersion.model_fields if k in v.row},
                                          "history": v.history})


@router.get("", response_model=DatasetList)
def list_datasets(tenant: Tenant, service: Service) -> DatasetList:
    """Every dataset with the versions built for your tenant alone."""
    found = service.datasets(tenant)
    return DatasetList(items=[Dataset(name=name, versions=[_version(v) for v in versions])
                              for name, versions in found.items()])


@router.get("/{name}", response_model=DatasetDetail)
def get_dataset(tenant: Tenant, service: Service, name: Annotated[str, Path(min_length=1, max_length=128)],
                version: Annotated[int | None, Query(ge=0)] = None) -> DatasetDetail:
    """A version's manifest (the newest unless ``version`` is given) and every version of the dataset."""
    chosen, versions = service.dataset(tenant, name, version)
    return DatasetDetail(name=name, version=chosen.version, manifest=chosen.manifest,
                         versions=[_version(v) for v in versions])
