import pytest
import torch

from blink.kernels.sampling_state import FLAG_LOGIT_BIAS, FLAG_PENALTIES, SamplingState
from blink.request import MAX_LOGIT_BIAS, SamplingParams

VOCAB = 50


def test_tensor_names_dtypes_and_shapes_are_the_contract():
    state = SamplingState(4, VOCAB, "cpu")
    expected = {
        "temperature": (torch.float32, (4,)), "top_p": (torch.float32, (4,)), "top_k": (torch.int32, (4,)),
        "min_p": (torch.float32, (4,)), "presence_penalty": (torch.float32, (4,)),
        "frequency_penalty": (torch.float32, (4,)), "repetition_penalty": (torch.float32, (4,)),
        "seed": (torch.int64, (4,)), "bias_ids": (torch.int32, (4, MAX_LOGIT_BIAS)),
        "bias_vals": (torch.float32, (4, MAX_LOGIT_BIAS)), "output_counts": (torch.int32, (4, VOCAB)),
        "prompt_mask": (torch.uint8, (4, VOCAB)), "flags": (torch.int32, (4,)),
        "num_logprobs": (torch.int32, (4,)),
    }
    for name, (dtype, shape) in expected.items():
        tensor = getattr(state, name)
        assert tensor.dtype == dtype and tuple(tensor.shape) == shape, name
        assert tensor.is_contiguous(), name
    # A slot never admitted is a greedy, penalty-free padding row.
    assert (state.temperature == 0).all() and (state.flags == 0).all() and (state.bias_ids == -1).all()
    assert (state.num_logprobs == 0).all()  # ...that asks for no top logprobs


def test_set_slot_writes_every_parameter():
    state = SamplingState(3, VOCAB, "cpu")
    params = SamplingParams(temperature=0.5, top_p=0.8, top_k=7, min_p=0.1, presence_penalty=0.25,
                            frequency_penalty=-0.5, repetition_penalty=1.5, logit_bias={3: 2.0, 40: -100.0},
                            logprobs=7)
    state.set_slot(1, params, seed=2**64 - 1, prompt_ids=[1, 2, 2], output_ids=[5, 5, 6])
    assert state.temperature[1] == 0.5 and state.top_p[1] == pytest.approx(0.8) and state.top_k[1] == 7
    assert state.min_p[1] == pytest.approx(0.1) and state.presence_penalty[1] == 0.25
    assert state.frequency_penalty[1] == -0.5 and state.repetition_penalty[1] == 1.5
    assert state.seed[1] == -1  # the low 64 bits, as a signed int64
    assert state.num_logprobs[1] == 7
    assert state.flags[1] == FLAG_PENALTIES | FLAG_LOGIT_BIAS
    assert state.bias_ids[1, :3].tolist() == [3, 40, -1] and (state.bias_ids[1, 2:] == -1).all()
    assert state.bias_vals[1, :3].tolist() == [2.0, -100.0, 0.0]
    assert state.prompt_mask[1].nonzero().flatten().tolist() == [1, 2]
    assert state.output_counts[1, 5] == 2 and state.output_counts[1, 6] == 1
    assert state.output_counts[1].sum() == 3
    # Other slots untouched.
    assert state.flags[0] == 0 and state.flags[2] == 0 and state.output_counts[[0, 2]].sum() == 0


def test_flags_follow_the_parameters():
    state = SamplingState(3, VOCAB, "cpu")
    state.set_slot(0, SamplingParams(), seed=1, prompt_ids=[1])
    state.set_slot(1, SamplingParams(repetition_penalty=1.1), seed=1, prompt_ids=[1])
    state.set_slot(2, SamplingParams(logit_bias={4: 1.0}), seed=1, prompt_ids=[1])
    assert state.flags.tolist() == [0, FLAG_PENALTIES, FLAG_LOGIT_BIAS]


def test_set_slot_resets_a_reused_slot():
    state = SamplingState(2, VOCAB, "cpu")
    state.set_slot(0, SamplingParams(presence_penalty=1.0, logit_bias={9: 5.0}, logprobs=2), seed=3,
                   prompt_ids=[7, 8], output_ids=[1])
    state.record_tokens(torch.tensor([0], dtype=torch.int32), torch.tensor([2]))
    state.set_slot(0, SamplingParams(temperature=0.0), seed=4, prompt_ids=[10])
    assert state.flags[0] == 0 and state.presence_penalty[0] == 0 and state.seed[0] == 4
    assert state.num_logprobs[0] == 0  # logprobs=None
    assert (state.bias_ids[0] == -1).all() and (state.bias_vals[0] == 0).all()
    assert state.output_counts[0].sum() == 0 and state.prompt_mask[0].sum() == 0
    state.set_slot(0, SamplingParams(frequency_penalty=1.0), seed=4, prompt_ids=[11])
    assert state.prompt_mask[0].nonzero().flatten().tolist() == [11]
    assert state.output_counts[0].sum() == 0


def test_record_tokens_counts_only_penalized_real_rows():
    state = SamplingState(3, VOCAB, "cpu")
    state.set_slot(0, SamplingParams(frequency_penalty=0.5), seed=1, prompt_ids=[1])
    state.set_slot(1, SamplingParams(), seed=1, prompt_ids=[1])  # no penalties: nothing to count
    state.set_slot(2, SamplingParams(repetition_penalty=1.2), seed=1, prompt_ids=[1])
    slots = torch.tensor([0, 1, 2, -1, 0, 2], dtype=torch.int32)
    tokens = torch.tensor([4, 4, 9, 4, 4, -1])  # slot -1 is padding; token -1 means no token
    state.record_tokens(slots, tokens)
    state.record_tokens(slots[:1], tokens[:1])
    assert state.output_counts[0, 4] == 3 and state.output_counts[0].sum() == 3
    assert state.output_counts[1].sum() == 0
    assert state.output_counts[2, 9] == 1 and state.output_counts[2].sum() == 1


def test_set_slot_rejects_out_of_range_inputs():
    state = SamplingState(2, VOCAB, "cpu")
    with pytest.raises(ValueError, match="logit_bias"):
        state.set_slot(0, SamplingParams(logit_bias={VOCAB: 1.0}), seed=1, prompt_ids=[1])
    with pytest.raises(ValueError, match="slot"):
        state.set_slot(2, SamplingParams(), seed=1, prompt_ids=[1])
