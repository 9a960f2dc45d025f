"""A dataset build as an OpenLineage RunEvent, for Marquez, DataHub and other lineage tools.

Inputs are the source tables at the Delta versions the build pinned, the
output is ``datasets/NAME`` at its new version; the namespace is the lake.
The run id is derived from (dataset, version, content hash), so the same
version always yields the same event.
"""

from __future__ import annotations

import uuid
from typing import Any

SPEC = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent"
VERSION_FACET = "https://openlineage.io/spec/facets/1-0-1/DatasetVersionDatasetFacet.json#/$defs/DatasetVersionDatasetFacet"
PRODUCER = "urn:trajlake:pipelines"


def run_event(manifest: dict[str, Any], *, namespace: str) -> dict[str, Any]:
    """The COMPLETE RunEvent of the build that made ``manifest``'s version.

    >>> run_event(get_manifest(lake, "nightly", 3), namespace=lake.root)["outputs"][0]["name"]  # doctest: +SKIP
    'datasets/nightly'
    """
    run_id = uuid.uuid5(uuid.NAMESPACE_URL, f"trajlake:{manifest['dataset']}@{manifest['version']}:"
                                            f"{manifest['content_hash']}")
    return {
        "eventType": "COMPLETE",
        "eventTime": manifest["built_at"],
        "producer": PRODUCER,
        "schemaURL": SPEC,
        "run": {"runId": str(run_id)},
        "job": {"namespace": "trajlake", "name": f"build-dataset.{manifest['dataset']}"},
        "inputs": [_dataset(namespace, table, version) for table, version in sorted(manifest["sources"].items())],
        "outputs": [_dataset(namespace, f"datasets/{manifest['dataset']}", manifest["version"])],
    }


def _dataset(namespace: str, name: str, version: int) -> dict[str, Any]:
    facet = {"_producer": PRODUCER, "_schemaURL": VERSION_FACET, "datasetVersion": str(version)}
    return {"namespace": namespace, "name": name, "facets": {"version": facet}}
