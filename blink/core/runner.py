"""Runs forward steps: fills the step buffers, then replays the bucket's CUDA graph (or runs eagerly).

Sampling runs inside the same graph as the forward, so one replay yields the step's tokens. The same
buffers and capture are used by device mode (blink/device/runtime.py), which launches the graphs from
the GPU instead of replaying them from here.
"""
from __future__ import annotations

import gc
from collections.abc import Callable

import torch

from blink.core.limits import EngineLimits
from blink.core.outputs import PromptLogprob, SampledToken, SchedulerOutput
from blink.core.step_buffers import StepBuffers
from blink.kernels.attention_merge import split_tickets
from blink.kernels.prompt_logprobs import prompt_logprobs
from blink.kernels.sampling import SampleOutput, sample
from blink.kernels.sampling_grid import SEARCHLESS_DEFAULT
from blink.request import MAX_TOP_LOGPROBS


class ModelRunner:
    def __init__(self, model, kv_cache, sampling_state, limits: EngineLimits, device, *, use_graphs: bool,
                 samples: bool = True, searchless_graphs: bool | None = None):
        """samples=False: the step ends at the logits (a device-mode TP follower: rank 0 samples).
        searchless_graphs: each decode bucket (tokens == seqs) also captured with the sampler's search left out
        (kernels/sampling.sample's search=False), in self.searchless_graphs, which run() replays for steps whose
        rows need no search (needs_search); None: BLINK_SAMPLER_SEARCHLESS's choice (kernels/sampling_grid)."""
        self.model = model
        self.limits = limits
        self.samples = samples
        self.kv_cache = kv_cache
        self.kv_layers = kv_cache.layers()
        self.sampling_state = sampling_state
        self.scratch_slot = limits.max_num_seqs  # the sampling state's extra row: counts nothing
        self.device = torch.device(device)
        self.max_blocks_per_seq = limits.max_blocks_per_seq
        self.buckets = list(limits.buckets)
        self.max_tokens, self.max_seqs = self.buckets[-1][0], max(s for _, s in self.buckets)
        self.num_prompt_rows = limits.prompt_logprob_rows  # prompt-logprob rows per step (0 under TP)
        # Attention's split-merge tickets (kernels/attention_merge.py): one zeroed set for every layer and step
        self.split_tickets = None
        if self.device.type == "cuda" and self.kv_layers:
            self.split_tickets = split_tickets(self.max_tokens + self.max_seqs, self.kv_layers[0][0].shape[2],
                                               self.device)
        self.buffers = self.new_buffers()
        self._prompt_rows_idle = False  # self.buffers' P prompt rows are all padding (prepare skips them)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.searchless_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # Eager steps on a GPU run the bucket's padded shape too, so that eager is the graphs minus capture: the
        # kernels' shape-dependent choices (attention splits, GEMV or cuBLAS, cuBLAS's algorithm) then match and
        # any difference in output is a capture bug. Unpadded, bf16 greedy on random weights parted in 11 of 24
        # requests under session 13's attention splits (perf.md, 2026-12-03). The CPU runs the exact shape.
        self.pad_to_buckets = self.device.type == "cuda"
        # One memory pool for every capture (host mode's and device mode's).
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        if searchless_graphs is None:
            searchless_graphs = SEARCHLESS_DEFAULT
        if use_graphs:
            for bucket in reversed(self.buckets):  # largest first, so smaller ones reuse its pool
                self.graphs[bucket] = self.capture(bucket, self.buffers)
                if searchless_graphs and samples and bucket[0] == bucket[1]:
                    self.searchless_graphs[bucket] = self.capture(bucket, self.buffers, search=False)

    @classmethod
    def for_model(cls, loaded, use_graphs: bool | None = None, samples: bool = True,
                  searchless_graphs: bool | None = None) -> ModelRunner:
        """The runner of a LoadedModel (blink/core/loaded_model.py); use_graphs None: CUDA graphs on a GPU."""
        if use_graphs is None:
            use_graphs = loaded.device == "cuda"
        return cls(loaded.model, loaded.kv_cache, loaded.sampling_state, loaded.limits, loaded.device,
                   use_graphs=use_graphs, samples=samples, searchless_graphs=searchless_graphs)

    def new_buffers(self) -> StepBuffers:
        return StepBuffers.allocate(self.max_tokens, self.max_seqs, self.max_blocks_per_seq, self.device,
                                    prompt_rows=self.num_prompt_rows)

    # -- the step itself (graph body) -----------------------------------------------------------------
    def forward(self, buf: StepBuffers, num_tokens: int, num_seqs: int, search: bool = True) -> None:
        attn = buf.attention(num_tokens, num_seqs, self.split_tickets)
        hidden = self.model(buf.input_ids[:num_tokens], buf.positions[:num_tokens], attn, self.kv_layers)
        rows = buf.logits_indices[:num_seqs]
        p = min(self.num_prompt_rows, num_tokens)  # a step has at most num_tokens prompt rows
        if p:  # one LM-head GEMM for both: its weight is read once
            rows = torch.cat([rows, buf.prompt_rows[:p]])
        logits = self.model.compute_logits(hidden[rows])  # all-gathered under TP
        if p:
            prompt_logprobs(logits[num_seqs:], buf.prompt_targets[:p], buf.prompt_num_top[:p], buf.prompt_logprob[:p],
                            buf.prompt_rank[:p], buf.prompt_top_ids[:p], buf.prompt_top_logprobs[:p])
            logits = logits[:num_seqs]
        if not self.samples:
            return
        slots = buf.sample_slots[:num_seqs]
        out = SampleOutput(buf.sampled_ids[:num_seqs], buf.logprobs[:num_seqs], buf.top_ids[:num_seqs],
                           buf.top_logprobs[:num_seqs])  # the sampler writes the step's outputs in place
        # record: the token counted in its slot's penalty history and a constrained slot's DFA advanced, in the
        # sampler's last kernel on a GPU
        sample(logits, slots, buf.sample_positions[:num_seqs], self.sampling_state, MAX_TOP_LOGPROBS, out=out,
               record=True, search=search)

    def capture(self, bucket: tuple[int, int], buf: StepBuffers,
                on_graph_end: Callable[[int], None] | None = None, search: bool = True) -> torch.cuda.CUDAGraph:
        """Capture one bucket; on_graph_end(stream_ptr) may append kernels (device mode's step_done); search:
        forward's."""
        t, s = bucket
        buf.query_start_loc.zero_()  # all sequences empty: the warm-up touches no real state
        buf.seq_lens.zero_()
        buf.slot_mapping.fill_(-1)
        buf.sample_slots.fill_(self.scratch_slot)
        buf.prompt_targets.fill_(-1)  # padding: the prompt-logprob kernel skips every row
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up: Triton compiles, cuBLAS picks algorithms, outside the capture
                self.forward(buf, t, s, search)
        torch.cuda.current_stream(self.device).wait_stream(side)
        # Free garbage now: a CUDA graph or block freed by the collector during the capture (an earlier
        # engine's, say) would call cudaFree, which invalidates a capture in torch's global mode.
        gc.collect()
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, pool=self.pool):
            self.forward(buf, t, s, search)
            if on_graph_end is not None:
                on_graph_end(torch.cuda.current_stream(self.device).cuda_stream)
        graph.instantiate()
        return graph

    # -- host mode: fill, run, read back --------------------------------------------------------------
    def bucket_for(self, num_tokens: int, num_seqs: int) -> tuple[int, int]:
        for t, s in self.buckets:
            if t >= num_tokens and s >= num_seqs:
                return t, s
        raise ValueError(f"step of {num_tokens} tokens / {num_seqs} seqs exceeds the largest bucket")

    def prepare(self, plan: SchedulerOutput, buf: StepBuffers, bucket: tuple[int, int]) -> None:
        self.fill(buf, self.step_inputs(plan, bucket))
        if not self.num_prompt_rows:
            return
        wanted = any(c.num_prompt_rows for c in plan.chunks)
        if wanted or not (buf is self.buffers and self._prompt_rows_idle):
            # Without prompt rows, all P rows become padding once; steps after that rewrite nothing.
            self.fill(buf, self.prompt_inputs(plan, bucket if wanted else (self.num_prompt_rows, 0)))
            if buf is self.buffers:
                self._prompt_rows_idle = not wanted

    def prompt_inputs(self, plan: SchedulerOutput, bucket: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The prompt-logprob rows (StepBuffers.prompt_*), padded to the min(P, T) rows the bucket's graph reads;
        csrc/sched_plan.h write_inputs writes the same in device mode."""
        rows, targets, num_top, row0 = [], [], [], 0
        for c in plan.chunks:
            for j in range(c.num_prompt_rows):
                rows.append(row0 + j)
                targets.append(c.seq.prompt_ids[c.start + j + 1])
                num_top.append(c.seq.params.prompt_logprobs)
            row0 += c.num_tokens
        pad = min(self.num_prompt_rows, bucket[0]) - len(rows)
        if pad < 0:
            raise ValueError(f"{len(rows)} prompt-logprob rows exceed the step's {len(rows) + pad}")
        return {"prompt_rows": torch.tensor(rows + [0] * pad, dtype=torch.int64),
                "prompt_targets": torch.tensor(targets + [-1] * pad, dtype=torch.int64),
                "prompt_num_top": torch.tensor(num_top + [0] * pad, dtype=torch.int32)}

    def step_inputs(self, plan: SchedulerOutput, bucket: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The step's inputs as CPU tensors padded to the bucket, keyed by StepBuffers field name
        (tensor-parallel rank 0 sends exactly these to the other ranks)."""
        t_pad, s_pad = bucket
        ids, pos, slots, qsl, lens, logit_rows, sslots, spos = [], [], [], [0], [], [], [], []
        bs = self.kv_cache.block_size
        table = torch.zeros((s_pad, self.max_blocks_per_seq), dtype=torch.int32)
        for i, c in enumerate(plan.chunks):
            seq = c.seq
            for p in range(c.start, c.start + c.num_tokens):
                ids.append(seq.token_at(p))
                pos.append(p)
                slots.append(seq.block_ids[p // bs] * bs + p % bs)
            qsl.append(len(ids))
            lens.append(c.start + c.num_tokens)
            logit_rows.append(len(ids) - 1)
            sslots.append(seq.slot if c.samples else self.scratch_slot)
            spos.append(seq.num_tokens)
            table[i, : len(seq.block_ids)] = torch.tensor(seq.block_ids, dtype=torch.int32)
        n, s = len(ids), len(plan.chunks)
        pad_t, pad_s = t_pad - n, s_pad - s
        return {
            "input_ids": torch.tensor(ids + [0] * pad_t, dtype=torch.int64),
            "positions": torch.tensor(pos + [0] * pad_t, dtype=torch.int64),
            "slot_mapping": torch.tensor(slots + [-1] * pad_t, dtype=torch.int64),
            "query_start_loc": torch.tensor(qsl + [n] * pad_s, dtype=torch.int32),
            "seq_lens": torch.tensor(lens + [0] * pad_s, dtype=torch.int32),
            "logits_indices": torch.tensor(logit_rows + [0] * pad_s, dtype=torch.int64),
            "sample_slots": torch.tensor(sslots + [self.scratch_slot] * pad_s, dtype=torch.int32),
            "sample_positions": torch.tensor(spos + [0] * pad_s, dtype=torch.int64),
            "block_tables": table,
        }

    def fill(self, buf: StepBuffers, inputs: dict[str, torch.Tensor]) -> None:
        for name, values in inputs.items():
            getattr(buf, name)[: len(values)].copy_(values, non_blocking=True)

    def run(self, bucket: tuple[int, int], search: bool = True) -> None:
        """Replay the bucket's graph on self.buffers (or run it eagerly); search=False: its graph without the
        sampler's search where one was captured (a plan whose rows need none, needs_search)."""
        if self.graphs:
            graphs = self.searchless_graphs if not search and bucket in self.searchless_graphs else self.graphs
            graphs[bucket].replay()
        else:
            self.forward(self.buffers, *bucket, search=search)

    @staticmethod
    def needs_search(plan: SchedulerOutput) -> bool:
        """Whether a row of the step that samples needs the sampler's search (the rest sample the scratch slot,
        whose token nobody reads); csrc/sched_variant.h decides the same in device mode."""
        return any(c.samples and c.seq.params.needs_search for c in plan.chunks)

    def execute(self, plan: SchedulerOutput) -> list[SampledToken | None]:
        """Run one step; returns, per chunk, the sampled token (None for a chunk mid-prefill)."""
        bucket = self.bucket_of(plan)
        self.prepare(plan, self.buffers, bucket)
        self.run(bucket, self.needs_search(plan))
        return self.read_back(plan)

    def bucket_of(self, plan: SchedulerOutput) -> tuple[int, int]:
        n, s = plan.num_tokens, len(plan.chunks)
        return self.bucket_for(n, s) if self.graphs or self.pad_to_buckets else (n, s)

    def read_back(self, plan: SchedulerOutput) -> list[SampledToken | None]:
        s = len(plan.chunks)
        buf = self.buffers
        ids = buf.sampled_ids[:s].tolist()
        lps = buf.logprobs[:s].tolist()
        k = min(plan.max_top_logprobs, MAX_TOP_LOGPROBS)
        tops = buf.top_ids[:s, :k].tolist() if k else [[]] * s
        top_lps = buf.top_logprobs[:s, :k].tolist() if k else [[]] * s
        if self.num_prompt_rows:
            plan.prompt_logprobs = self.read_prompt_logprobs(plan)
        return [SampledToken(ids[i], lps[i], tops[i], top_lps[i]) if c.samples else None
                for i, c in enumerate(plan.chunks)]

    def read_prompt_logprobs(self, plan: SchedulerOutput) -> list[list[PromptLogprob]]:
        """Per chunk, the prompt logprobs its rows computed (the rows in prompt_inputs' order)."""
        counts = [c.num_prompt_rows for c in plan.chunks]
        n = sum(counts)
        if n == 0:
            return []
        b = self.buffers
        k = max(c.seq.params.prompt_logprobs for c, r in zip(plan.chunks, counts, strict=True) if r)
        lps, ranks = b.prompt_logprob[:n].tolist(), b.prompt_rank[:n].tolist()
        tops, top_lps = b.prompt_top_ids[:n, :k].tolist(), b.prompt_top_logprobs[:n, :k].tolist()
        out, r = [], 0
        for c, count in zip(plan.chunks, counts, strict=True):
            want = c.seq.params.prompt_logprobs or 0
            entries = []
            for j in range(count):
                index = c.start + j + 1
                entries.append(PromptLogprob(index, c.seq.prompt_ids[index], lps[r], ranks[r], tops[r][:want],
                                             top_lps[r][:want]))
                r += 1
            out.append(entries)
        return out
