"""Dataset builds: selection, reward join, group advantages, token-exact merging, samples, versioned
datasets in the registry, diff and export."""
