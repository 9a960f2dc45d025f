"""One router per resource: completions, models, events, health."""
