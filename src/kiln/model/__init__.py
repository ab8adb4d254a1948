"""Decoder models: named flavours and ModelConfig (registry, torch-free), the GPT-2 (gpt) and Llama
(llama) families, building/saving/loading (build). Hugging Face interop is kiln.hf, a layer up: an
export carries the tokenizer, which is data's."""
