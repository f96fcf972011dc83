"""Tensor parallelism for both modes: groups (group.py), rank processes (ranks.py, worker.py), host mode's step
queue and runner (step_queue.py, step_message.py, host_tp.py), device mode's followers (device_follower.py,
device_tp.py), CUDA IPC (ipc.py) and blink's peer-to-peer all-reduce (p2p_allreduce.py)."""
