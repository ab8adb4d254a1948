"""13-gram overlap of each eval set with the training tokens, which the eval_data stage measured."""
