"""Cost models that rank configs before they are measured (the learned model lands here)."""
