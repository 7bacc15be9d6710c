"""hora."""
