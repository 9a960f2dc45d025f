"""The application shell: the ``trajlake`` command, its settings and the demo."""
