"""Defaults of the options every process shares, importable without pydantic.

``schemas.options.CommonOptions`` declares the options with these defaults; the CLI's light paths
(``trajlake.plain_settings``, which keeps ``trajlake sql`` free of pydantic) read them from here, so each default
is written once.
"""

DEFAULT_LAKE = "./lake"
"""Lake root when TRAJLAKE_LAKE / --lake is not given."""
DEFAULT_TOPIC = "trajlake.events"
"""Topic of trajectory events; here rather than in ``schemas.events`` (which re-exports it) so that reading the
options does not build the event models."""
