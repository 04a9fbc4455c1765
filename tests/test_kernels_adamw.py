"""MasterAdamW's Triton pass vs a float64 AdamW: moments, the update, the bf16 copy and the
parameter norm."""

import pytest
import torch
from kernel_numerics import DEVICE, assert_rel_close

from kernels.adamw import MasterAdamW, adamw_reference

pytestmark = pytest.mark.usefixtures("seeded")

LR, WD, BETAS, EPS = 1e-2, 0.1, (0.9, 0.999), 1e-8
# The update (new minus old master) is fp32 arithmetic on weights ~1 moved by ~lr = 1e-2: each
# step's rounding of the stored master (2^-24 of ~1) is ~6e-6 of the update, two steps ~1.2e-5, and
# the fp32 bias correction 1 - 0.999^t is 1.3e-5 off at t=1 (as in torch's capturable AdamW), 6.5e-6
# in the step: 5e-5. The moments are a few fp32 roundings (1e-6); the bf16 copy one rounding of the
# master (2^-8 relative, twice that where the CPU interpreter rounds toward zero).
TOL = {"update": 5e-5, "moments": 1e-6, "copy": 1e-2, "norm": 1e-6}


def _cat(tensors) -> torch.Tensor:
    return torch.cat([t.flatten() for t in tensors])


def _params(shapes: list[tuple[int, ...]]) -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.randn(shape, device=DEVICE)) for shape in shapes]


@pytest.mark.parametrize("low_precision", [True, False], ids=["bf16-weights", "fp32-weights"])
def test_two_steps_match_fp64(low_precision):
    # under, at and over one program's block, odd tails
    shapes = [(1,), (2049,), (37, 257), (3, 5, 300)]
    params = _params(shapes)
    ref = [p.detach().double().clone() for p in params]
    moments = [(torch.zeros_like(r), torch.zeros_like(r)) for r in ref]
    opt = MasterAdamW(
        params, params if low_precision else [], lr=LR, weight_decay=WD, betas=BETAS, eps=EPS
    )
    assert all(p.dtype == (torch.bfloat16 if low_precision else torch.float32) for p in params)
    # fresh random gradients, a clip factor on the first
    for step, grad_scale in [(1, 2.5), (2, 1.0)]:
        grads = [torch.randn(s, device=DEVICE) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.to(p.dtype)
        opt.grad_scale = torch.tensor(grad_scale, device=DEVICE)
        before = [r.clone() for r in ref]
        opt.step()
        for r, (m, v), p in zip(ref, moments, params):
            adamw_reference(r, p.grad, m, v, step, LR, WD, BETAS, EPS, grad_scale)
        # Over all tensors at once (a one-element tensor's own update can nearly cancel: no scale of
        # its own).
        update = _cat(m.double() - b for m, b in zip(opt.masters, before))
        assert_rel_close(
            update, _cat(r - b for r, b in zip(ref, before)), TOL["update"], f"step {step}: update"
        )
        assert_rel_close(
            _cat(opt.exp_avgs), _cat(m for m, _ in moments), TOL["moments"], f"step {step}: exp_avg"
        )
        assert_rel_close(
            _cat(opt.exp_avg_sqs),
            _cat(v for _, v in moments),
            TOL["moments"],
            f"step {step}: exp_avg_sq",
        )
        for i, (master, r) in enumerate(zip(opt.masters, ref)):
            if low_precision:
                assert_rel_close(
                    params[i].detach(), r, TOL["copy"], f"step {step} tensor {i}: the bf16 copy"
                )
            else:  # an fp32 weight is its own master
                assert params[i].data_ptr() == master.data_ptr()
        norm_before = torch.linalg.vector_norm(torch.cat([b.flatten() for b in before]))
        assert_rel_close(opt.param_norm(), norm_before, TOL["norm"], f"step {step}: param_norm")


def test_matches_torch_adamw():
    """fp32 weights, no clipping: the same trajectory as torch.optim.AdamW over three steps."""
    ours = _params([(129, 65)])
    theirs = [torch.nn.Parameter(ours[0].detach().clone())]
    opt = MasterAdamW(ours, [], lr=LR, weight_decay=WD)
    torch_opt = torch.optim.AdamW(theirs, lr=LR, weight_decay=WD, foreach=False)
    for _ in range(3):
        g = torch.randn(129, 65, device=DEVICE)
        ours[0].grad, theirs[0].grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()
    assert_rel_close(ours[0].detach(), theirs[0].detach(), 1e-6, "weights after three steps")


def test_restore_returns_to_the_start():
    params = _params([(300,), (17, 33)])
    opt = MasterAdamW(params, params[:1], lr=LR, weight_decay=WD)
    start, weights = opt.snapshot(), [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    opt.restore(start)
    assert all(torch.equal(p, w) for p, w in zip(params, weights))
    assert all(torch.equal(m, s) for m, s in zip(opt.masters, start))
    assert float(opt.step_count) == 0 and all(float(m.abs().sum()) == 0 for m in opt.exp_avgs)


def test_state_holds_moments_and_the_masters_of_low_precision_weights():
    params = _params([(300,), (17, 33)])
    opt = MasterAdamW(params, params[:1], lr=LR, weight_decay=WD)
    state = [v for s in opt.state.values() for v in s.values()]
    fp32_bytes = sum(t.numel() * t.element_size() for t in state)
    # master + 2 moments; 2 moments; the step count
    assert fp32_bytes == 4 * (3 * 300 + 2 * 17 * 33) + 4


def test_refuses_low_precision_parameters():
    with pytest.raises(ValueError, match="fp32"):
        MasterAdamW(
            [torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))], [], lr=LR, weight_decay=WD
        )
