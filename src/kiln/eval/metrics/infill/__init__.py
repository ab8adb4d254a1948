"""Fill-in-the-middle on held-out documents (kiln.eval.infill): exact match and edit similarity."""
