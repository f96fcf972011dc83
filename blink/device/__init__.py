"""Device mode: the resident GPU scheduler (C++/CUDA in csrc/), its build, the structs it shares with
Python, the loop that launches it, and DeviceEngine."""
