"""Host mode: the conventional CPU scheduler loop (HostEngine) and the process loop that serves the rings with it."""
