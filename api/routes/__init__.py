"""One router per resource; ``app.create_query_app`` includes them in ``ROUTERS`` order."""
