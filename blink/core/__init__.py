"""The engine core both modes share: the Engine interface, the scheduler, KV blocks, the model runner and
its step buffers, the loaded model and its limits."""
