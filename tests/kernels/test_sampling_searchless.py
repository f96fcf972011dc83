"""The sampler without its search (sample_triton's search=False: penalties, choice and finish only), for batches
whose rows have no filter and ask for no top-K logprobs: the reference's tokens, logprobs and history updates,
and SamplingParams.needs_search, which says which rows may take it."""
import pytest
import torch

from blink.kernels.sampling import sample_ref, sample_triton
from blink.kernels.sampling_state import SamplingState
from blink.request import SamplingParams
from tests.kernels.test_sampling import MIXED_PARAMS
from tests.kernels.test_sampling_race import on_cuda

UNFILTERED = [
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.2, top_k=0, top_p=1.0, min_p=0.0, logprobs=0),
    SamplingParams(temperature=1.1, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.4),
    SamplingParams(temperature=0.0, repetition_penalty=0.8, logit_bias={3: 5.0, 11: -2.0}),
    SamplingParams(temperature=0.9, logit_bias={0: 1.5, 5: 100.0, 6: -100.0}),
    SamplingParams(temperature=0.0, top_k=5, top_p=0.5),  # greedy: its filter never applies
]


def unfiltered_batch(num_rows: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    state = SamplingState(len(UNFILTERED), vocab, "cpu")
    for slot, params in enumerate(UNFILTERED):
        history = torch.randint(0, vocab, (16,), generator=gen).tolist()
        state.set_slot(slot, params, seed=77 + slot, prompt_ids=history[:10], output_ids=history[10:])
    logits = torch.randn(num_rows, vocab, generator=gen) * 3
    slots = torch.arange(num_rows, dtype=torch.int32) % len(UNFILTERED)
    if num_rows > 1:
        slots[-1] = -1  # a padding row
    positions = torch.randint(0, 10_000, (num_rows,), generator=gen)
    return logits, slots, positions, state


def test_needs_search_marks_filters_and_top_logprobs():
    for params in MIXED_PARAMS:
        sampled = params.temperature != 0
        filtered = sampled and (params.top_k > 0 or params.top_p < 1 or params.min_p > 0)
        assert params.needs_search == (filtered or bool(params.logprobs)), params
    assert not any(params.needs_search for params in UNFILTERED)


@pytest.mark.parametrize("num_rows", [1, 9])
def test_no_search_matches_the_reference(num_rows):
    """Tokens, logprobs, the top-K columns of rows that ask for none, and each penalty slot's history after the
    finish kernel's record: the reference's, as the full sampler gives them."""
    logits, slots, positions, state = unfiltered_batch(num_rows, 777, seed=num_rows)
    ref_state = unfiltered_batch(num_rows, 777, seed=num_rows)[3]
    ref = sample_ref(logits, slots, positions, ref_state, 4)
    got = sample_triton(logits, slots, positions, state, 4, record=True, search=False)
    full = sample_triton(logits, slots, positions, unfiltered_batch(num_rows, 777, seed=num_rows)[3], 4)
    assert got.token_ids.tolist() == ref.token_ids.tolist() == full.token_ids.tolist()
    torch.testing.assert_close(got.logprobs, ref.logprobs)
    assert (got.top_ids == -1).all() and torch.equal(got.top_ids, ref.top_ids)
    ref_state.record_tokens(slots, ref.token_ids)
    assert torch.equal(state.output_counts, ref_state.output_counts)


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [1, 32])
def test_gpu_no_search_on_a_real_vocab(num_rows):
    """V = 128,256 on the GPU, compiled (the interpreter forgives what the compiler refuses): the reference's
    tokens and logprobs without the search, at one row's grid and 32 rows'."""
    logits, slots, positions, cpu_state = unfiltered_batch(num_rows, 128256, seed=num_rows)
    logits = logits.bfloat16().float()
    cuda_state = on_cuda(cpu_state)
    ref = sample_ref(logits, slots, positions, cpu_state, 20)
    got = sample_triton(logits.cuda(), slots.cuda(), positions.cuda(), cuda_state, 20, search=False)
    assert got.token_ids.cpu().tolist() == ref.token_ids.tolist()
    torch.testing.assert_close(got.logprobs.cpu(), ref.logprobs, rtol=1e-5, atol=1e-5)
    assert (got.top_ids == -1).all()


@pytest.mark.gpu
def test_gpu_runner_graphs_without_the_search(tmp_path):
    """ModelRunner's searchless_graphs: a decode bucket captured without the search samples the tokens its full
    graph samples, for greedy and plain-temperature rows (a tiny model, fp32)."""
    from blink.bench.step import decode_plan
    from blink.config import EngineArgs
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner
    from tests.hf_models import make_tiny_model

    path = make_tiny_model(tmp_path, "llama")
    loaded = LoadedModel.load(EngineArgs(model=str(path), device="cuda", dtype="float32", max_num_seqs=8,
                                         max_num_batched_tokens=8, num_kv_blocks=40, block_size=16))
    runner = ModelRunner.for_model(loaded, use_graphs=True, searchless_graphs=True)
    assert set(runner.searchless_graphs) == {b for b in runner.graphs if b[0] == b[1]}
    for slot in range(8):
        runner.sampling_state.set_slot(slot, UNFILTERED[slot % 2], seed=slot, prompt_ids=[])  # greedy, temperature
    plan = decode_plan(None, 8, 60, 16)
    bucket = runner.bucket_for(8, 8)
    runner.prepare(plan, runner.buffers, bucket)
    tokens = []
    for graphs in (runner.graphs, runner.searchless_graphs):
        graphs[bucket].replay()
        tokens.append(runner.buffers.sampled_ids[:8].tolist())
    assert tokens[0] == tokens[1]


@pytest.mark.gpu
def test_gpu_a_searchless_step_leaves_the_next_searched_step_alone(tmp_path):
    """The engines alternate the two graphs step by step: a filtered batch's tokens, after a searchless step of
    unfiltered rows in between, are the ones it gets before it (nothing the search's launches keep is stale)."""
    from blink.bench.step import decode_plan
    from blink.config import EngineArgs
    from blink.core.loaded_model import LoadedModel
    from blink.core.runner import ModelRunner
    from tests.hf_models import make_tiny_model

    path = make_tiny_model(tmp_path, "llama")
    loaded = LoadedModel.load(EngineArgs(model=str(path), device="cuda", dtype="float32", max_num_seqs=8,
                                         max_num_batched_tokens=8, num_kv_blocks=40, block_size=16))
    runner = ModelRunner.for_model(loaded, use_graphs=True, searchless_graphs=True)
    filtered = [SamplingParams(temperature=0.9, top_p=0.8), SamplingParams(temperature=0.7, top_k=7, logprobs=3),
                SamplingParams(temperature=1.0, min_p=0.2)]
    plan = decode_plan(None, 8, 60, 16)
    bucket = runner.bucket_for(8, 8)
    runner.prepare(plan, runner.buffers, bucket)

    def step(params: list[SamplingParams], search: bool) -> list[int]:
        for slot in range(8):
            runner.sampling_state.set_slot(slot, params[slot % len(params)], seed=slot, prompt_ids=[])
        runner.run(bucket, search)
        return runner.buffers.sampled_ids[:8].tolist() + runner.buffers.top_ids[:8].flatten().tolist()

    first = step(filtered, True)
    step(UNFILTERED[:2], False)
    assert step(filtered, True) == first
