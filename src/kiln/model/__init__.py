"""Decoder models, one folder per family (kiln.model.registry names them: gpt2, llama, starcoder2), each
with its torch-free spec and Hugging Face mapping beside its nn.Module; the layers and the RoPE decoder
more than one family builds from (layers, decoder), the KV cache and the chunked loss;
building/saving/loading (build). Hugging Face export and import is kiln.hf, a layer up: an export
carries the tokenizer, which is data's. docs/extending.md adds a family."""
