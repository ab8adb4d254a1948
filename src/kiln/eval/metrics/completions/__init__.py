"""eval.prompts completed by the final model, greedily and sampled, with token healing."""
