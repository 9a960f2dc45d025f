"""Dataset pipelines: selection, reward join, group advantages, token-exact
merging, versioned datasets with manifests, lineage and export."""
