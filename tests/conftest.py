import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

# CUDA results are compared with the CPU's at float32 tolerances: cuDNN's default TensorFloat-32
# convolutions (10-bit mantissa on Ampere and later) would move them by about 1e-3 relative.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)
