"""Small process-level utilities used across layers: CPU lists and pinning, dying with the parent."""
