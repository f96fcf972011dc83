"""Device-mode tensor parallelism on rank 0 (the engine process, or the in-process engine).

Rank 0 starts ranks 1..N-1 as spawned workers (worker.py; they run follower loops), loads its own shard,
then builds its DeviceLoop as usual: every rank captures the same bucket graphs in the same order (the
captures run the model's collectives), with NCCL graph mixing off so that the graphs can be launched from
the GPU. Once captured, each follower publishes its arena (follower.py) on the rendezvous store and rank
0 maps it; from then on rank 0's scheduler kernel drives every rank through peer memory, no host involved.
Only rank 0 talks to the rings. Stop: rank 0's loop posts stop to the followers as it exits.
"""
from __future__ import annotations

import pickle

from blink.config import EngineArgs
from blink.parallel.ranks import launch_ranks, raise_worker_failure
from blink.parallel.worker import follower_key


class DeviceTensorParallel:
    def __init__(self, args: EngineArgs):
        self.size = args.tensor_parallel_size
        self.loaded, self.group, self.workers, self.store = launch_ranks(args)

    def peers(self) -> list:
        """The followers' PeerMappings, once they have captured (DeviceLoop calls this after its captures)."""
        from blink.device.build import load_device_library
        from blink.parallel.ipc import PeerMapping

        try:
            self.workers.wait_ready()
            lib = load_device_library()
            return [PeerMapping.open(pickle.loads(self.store.get(follower_key(rank))), lib)
                    for rank in range(1, self.size)]
        except Exception as e:
            raise_worker_failure(self.workers, e)

    def dead(self):
        """A follower process that has ended, as an error (None while all run); no waiting."""
        return self.workers.dead()

    def close(self) -> None:
        """After rank 0's loop exited (it posted stop): the followers finish and exit."""
        self.workers.close()

    def kill(self) -> None:
        self.workers.kill()
