"""Transport: the shared-memory segment (layout.py, the one definition of every record and the control
block) and the ingress/egress rings."""
