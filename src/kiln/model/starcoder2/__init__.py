"""StarCoder2 (Lozhkov et al. 2024): Llama's attention (RoPE, grouped-query) in a GPT-2-style block,
LayerNorm and a GELU MLP, with biases (model.bias). spec (torch-free: defaults, rules, counts, memory
terms), hf (Starcoder2ForCausalLM both ways), module (the nn.Module). Registered in
kiln.model.registry."""
