"""The reference engine: an OpenAI-compatible HTTP server for a checkpoint or a Hugging Face model
folder (``trajlake serve-model``), returning exact token ids and logprobs with every answer.

It is what the gateway proxies to in the demo and the tests; production points the gateway at
vLLM or SGLang instead.

``app`` assembles (the lifespan loads the model), ``routes/`` holds one router per route family,
``deps`` what routes reach (engine, body), ``respond`` the answer (JSON or SSE) chat and completions
share; below HTTP: ``protocol`` (requests, errors), ``engine``, ``sampling``, ``text``
and ``responses`` (the OpenAI bodies; tool calls parsed by ``schemas.tool_parsers``, which the
gateway's token sessions share).
"""
