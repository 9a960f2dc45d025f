"""The reference engine: an OpenAI-compatible HTTP server for a checkpoint or a Hugging Face model
folder (``trajlake serve-model``), returning exact token ids and logprobs with every answer.

It is what the gateway proxies to in the demo and the tests; production points the gateway at
vLLM or SGLang instead.
"""
