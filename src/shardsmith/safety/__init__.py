"""Guards that keep what a user owns safe: the output-folder lock and the path rules."""
