"""The harness workbench: compare harness versions, extract failure packets, the statistics behind
them."""
