"""Test set-up shared by every test: Triton runs in its interpreter where there is no GPU."""
import os
import shutil

# Must happen before triton is imported anywhere: the interpreter is chosen when kernels are decorated.
if not shutil.which("nvidia-smi") and "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.interpreter_patching import install

    install()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_tf32():
    """fp32 GPU references compare exactly: no TF32 in torch's matmuls and convolutions for the test."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
