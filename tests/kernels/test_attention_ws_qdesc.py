"""attention_ws.py's q descriptor made in the kernel (WS_Q_DESCS "device"): the proposed fix for the H200 deadlock of
the warp-specialised kernel (session 28), and the diagnosis behind it (tools/diag_ws.py runs it first on a GPU).

Compiled for sm_90, the pass halves q's load between the two consumer groups: with a host descriptor each copy
lands a [128, D] box where its mbarrier expects [64, D] (the hang); with the device descriptor the box is halved
too. Under the interpreter (fp16) the variant gives the reference.
"""
import json
import tempfile

import pytest
import torch

from blink.kernels.attention import paged_attention_ref
from blink.kernels.attention_ws import launch_ws_chunk
from tests.kernels.paged_batch import make_paged_batch
from tests.kernels.sm90 import run_uninterpreted
from tests.kernels.test_attention_ws import _COMPILE, HALF_TOL, Q_LENS, SEQ_LENS, _args


@pytest.mark.parametrize("block_q", [128, 64])
@pytest.mark.parametrize("block_size", [64, 128])
def test_a_descriptor_made_in_the_kernel_gives_the_reference(block_q, block_size):
    batch = make_paged_batch(Q_LENS, SEQ_LENS, 8, 2, head_dim=64, block_size=block_size, dtype=torch.float16,
                             pad_seqs=1, pad_tokens=3)
    n = batch.num_real_tokens
    out = launch_ws_chunk(*_args(batch), q_desc="device", block_q=block_q)
    torch.testing.assert_close(out[:n], paged_attention_ref(*_args(batch))[:n], **HALF_TOL)
    torch.testing.assert_close(out[:n], launch_ws_chunk(*_args(batch), block_q=block_q)[:n], atol=0, rtol=0)


def test_the_device_descriptor_reads_q_as_a_slice_of_the_qkv_output():
    """The token stride is the kernel's argument (stride_qt), not D * Hq."""
    batch = make_paged_batch(Q_LENS, SEQ_LENS, 8, 2, head_dim=64, block_size=64, dtype=torch.float16)
    tokens, hq, d = batch.q.shape
    qkv = torch.randn(tokens, (hq + 4) * d, dtype=torch.float16)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    q.copy_(batch.q)
    out = launch_ws_chunk(q, *_args(batch)[1:], q_desc="device")
    torch.testing.assert_close(out, launch_ws_chunk(*_args(batch)), atol=0, rtol=0)


@pytest.mark.parametrize("variant", ["qdev", "bq64", "host"])
def test_the_diag_tool_runs_each_variant(variant, capsys):
    from tools.diag_ws import run_case

    run_case("mixed", "load", True, 2, "cpu", variant)
    assert capsys.readouterr().out.startswith("ok maxerr")


@pytest.mark.slow  # spawns a process
def test_sm90_q_copies_expect_the_bytes_their_box_moves():
    """Specialised: q's copies are 64-row halves (expect_tx = 64 * D * 2 bytes). The host descriptor's box (from the
    kernel's metadata, which the launcher encodes) stays 128 rows, twice the bytes expected: pinned, so that a
    Triton which fixes or rejects it shows here. The device descriptor's box is 64 rows, and the kernel still
    specialises (12 warps, setmaxnreg); unspecialised its box is the whole 128-row tile."""
    # (group, block_n, d, ws, stages, MASK_V_TAIL, TABLE, q on device)
    configs = [(4, 128, 128, True, 2, False, 0, False), (4, 128, 128, True, 2, False, 0, True),
               (1, 64, 64, True, 2, False, 0, True), (4, 128, 128, False, 2, False, 0, True)]
    with tempfile.TemporaryDirectory() as tmp:
        results = json.loads(run_uninterpreted(["-c", _COMPILE, json.dumps(configs), tmp], timeout=600))
        ptx = [open(got["ptx"]).read() for got in results]
    for (_, _, d, ws, *_, qdev), got, text in zip(configs, results, ptx, strict=True):
        half = 64 * d * 2  # bytes of a consumer group's 64 rows of q
        if not qdev:  # the hang: each copy lands 128 rows where its barrier expects 64
            assert got["host_boxes"][0] == [128, min(d, 64)] and got["expect_tx"][:2] == [half, half], got
            continue
        assert len(got["host_boxes"]) == 2, got  # K and V only
        rows = 64 if ws else 128
        assert got["device_box"] == [min(d, 64), rows], got  # [inner (a 128-byte swizzle row), rows]
        assert got["expect_tx"][0] == rows * d * 2, got
        assert got["warps"] == (12 if ws else 4), got
        assert ("setmaxnreg.inc" in text) == ws and "cp.async.bulk.tensor" in text
