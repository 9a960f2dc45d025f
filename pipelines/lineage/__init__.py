"""Lineage: trace any id (checkpoint, dataset version, rollout, event) to the rest (``trace``) and
emit OpenLineage run events (``openlineage``)."""
