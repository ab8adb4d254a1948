"""Llama 3 (and Qwen2's shape, model.qkv_bias): RMSNorm, rotary positions, grouped-query attention,
a SwiGLU MLP; Llama 3.1's RoPE scaling as an option. spec (torch-free: defaults, rules, counts,
memory terms), hf (LlamaForCausalLM and Qwen2ForCausalLM both ways), module (the nn.Module).
Registered in kiln.model.registry."""
