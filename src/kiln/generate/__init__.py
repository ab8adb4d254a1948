"""Text generation from a model: batched decoding over a KV cache (decode) and prompts as text with
token healing (healing). Train (samples during a run) and eval (completion tasks) both generate, so
it sits below both, above model and data."""
