"""GPT-2 (Radford et al. 2019): learned positions, pre-LayerNorm blocks, a GELU MLP, a tied head.
spec (torch-free: defaults, rules, counts, memory terms), hf (GPT2LMHeadModel both ways), module (the
nn.Module). Registered in kiln.model.registry."""
