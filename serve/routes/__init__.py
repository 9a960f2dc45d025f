"""One router per route family: health, models, chat completions, text completions."""
