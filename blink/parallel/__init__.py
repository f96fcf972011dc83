"""Tensor parallelism: process groups (group.py), the step message (step_message.py), the worker ranks
(worker.py) and rank 0's runner that drives them in host mode (host_runner.py)."""
