"""The trajectory viewer without HTTP: what its pages read (``service``, ``stats``, ``tokens``), the
response models (``models``) and the static pages themselves (``STATIC_DIR``); its routes are
``api.routes.viewer``."""

from pathlib import Path

STATIC_DIR = Path(__file__).parent / "static"
"""The viewer's pages, scripts and stylesheet (local files: no CDN)."""
