"""GPU speed paths, checked on the CPU: ``torch.compile``, activation checkpointing, bf16 autocast.

``torch.compile`` captures the same graphs on the CPU as on the GPU; only the code generation differs
(Inductor's C++ backend here, Triton there). A cold Inductor compile of even this tiny U-Net takes 1-2 CPU
minutes on the 2-core CI machine (C++ compilation dominates), so the default suite compiles MaSA (the
benchmarks' default block) with the ``aot_eager`` backend: Dynamo capture plus AOTAutograd's joint
forward/backward graph, i.e. everything but the kernel code generation. The slow suite compiles every
bottleneck block with Inductor.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from medseg.attention.registry import block_choices
from medseg.models import build_model

BLOCKS = block_choices()
"""Every value of the bottleneck slot: none and each registered block."""
# A 3-level 3D U-Net with a bottleneck grid of 4x4x2 tokens: small enough to compile every block in seconds.
PATCH = (16, 16, 8)
SMALL = {"channels": [8, 16, 32], "strides": [2, 2], "bottleneck_depth": 1}


def small_unet(bottleneck: str, **overrides: object) -> nn.Module:
    """The default U-Net (:class:`ModelConfig`), narrowed to 8-16-32 channels, with ``bottleneck`` in its slot."""
    torch.manual_seed(0)
    return build_model({**SMALL, "bottleneck": bottleneck, **overrides}, in_channels=1, out_channels=3,
                       patch_size=PATCH)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    image = torch.randn(2, 1, *PATCH, generator=generator)
    label = torch.randint(0, 3, (2, *PATCH), generator=generator)
    return image, label


def _loss(model: Callable[[torch.Tensor], torch.Tensor], image: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(image).float(), label)


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def _check_compiled_matches_eager(bottleneck: str, backend: str) -> None:
    model = small_unet(bottleneck).train()
    image, label = _inputs()
    eager_out = model(image)
    _loss(model, image, label).backward()
    eager_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    compiled = torch.compile(model, backend=backend)
    compiled_out = compiled(image)
    torch.testing.assert_close(compiled_out, eager_out, atol=1e-4, rtol=1e-4)
    _loss(compiled, image, label).backward()
    compiled_grads = _grads(model)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in compiled_grads.items():
        assert torch.isfinite(grad).all(), name
        torch.testing.assert_close(grad, eager_grads[name], atol=1e-3, rtol=1e-3, msg=name)


@pytest.mark.full
def test_compile_matches_eager_masa() -> None:
    torch._dynamo.reset()
    _check_compiled_matches_eager("masa", backend="aot_eager")


@pytest.mark.slow
@pytest.mark.parametrize("bottleneck", BLOCKS)
def test_inductor_compile_matches_eager(bottleneck: str) -> None:
    torch._dynamo.reset()
    _check_compiled_matches_eager(bottleneck, backend="inductor")


@pytest.mark.parametrize("bottleneck", ["masa", "cswin"])
def test_checkpointing_gives_the_same_gradients(bottleneck: str) -> None:
    image, label = _inputs()
    grads = []
    for checkpointing in (False, True):
        model = small_unet(bottleneck, checkpointing=checkpointing, bottleneck_depth=2).train()
        _loss(model, image, label).backward()
        grads.append(_grads(model))
    assert grads[0].keys() == grads[1].keys() and any("bottleneck" in name for name in grads[0])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_bf16_autocast_training_step_is_finite() -> None:
    model = small_unet("masa").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    image, label = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        output = model(image)
    assert output.dtype == torch.bfloat16
    loss = _loss(lambda _: output, image, label)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    optimizer.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_compile_captures_the_norms_under_bf16_autocast() -> None:
    # The conv stages' norms branch on autocast (medseg.models.norms): Dynamo must capture the bf16 branch.
    torch._dynamo.reset()
    model = small_unet("none").train()
    image, label = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = model(image)
        compiled = torch.compile(model, backend="aot_eager")(image)
    assert compiled.dtype == eager.dtype == torch.bfloat16
    torch.testing.assert_close(compiled.float(), eager.float(), atol=2e-2, rtol=2e-2)
    _loss(lambda _: compiled, image, label).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@pytest.mark.gpu
def test_cuda_compiled_bf16_masa_step_matches_eager() -> None:
    """On CUDA: the default U-Net with MaSA (FlexAttention path: head_dim 32) compiled, bf16, fwd+bwd."""
    torch.manual_seed(0)
    model = build_model({"bottleneck": "masa", "strides": [2, 2, 2]}, in_channels=1, out_channels=3,
                        patch_size=(64, 64, 64))
    model = model.cuda().train()
    image = torch.randn(2, 1, 64, 64, 64, device="cuda")
    label = torch.randint(0, 3, (2, 64, 64, 64), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager = model(image)
        compiled = torch.compile(model)(image)
        loss = _loss(lambda _: compiled, image, label)
    torch.testing.assert_close(compiled.float(), eager.float(), atol=5e-2, rtol=5e-2)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
