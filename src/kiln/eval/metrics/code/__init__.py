"""HumanEval pass@k and HumanEval-Infilling pass@1, every program run in the sandbox (kiln.eval.code)."""
