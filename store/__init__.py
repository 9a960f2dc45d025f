"""The lake: Delta tables under one root (``store.lake``), SQL views over them
(``store.sql``) and whole trajectories read back in order (``store.trajectory``)."""
