"""Token sessions: chat calls of a rollout sent to the engine as token ids that extend the previous call's.

``state`` keeps each rollout's last prompt and sampled ids (LRU + TTL, bounded
by bytes); ``stitch`` decides whether a call extends them and builds the
token-id prompt (or names why not); ``schemas.tool_parsers`` turns raw completions back into
content and tool calls per model family; ``answer`` builds the chat answer the
client expects from the engine's completion, streaming and not.
"""
