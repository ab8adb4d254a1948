"""Decoder models: named flavours and ModelConfig (registry, torch-free), the GPT-2 (gpt) and Llama
(llama) families, building/saving/loading (build) and Hugging Face interop (hf)."""
