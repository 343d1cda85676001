"""Public operator entries."""
