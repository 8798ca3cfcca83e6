"""eagle_gate."""
