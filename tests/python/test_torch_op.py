"""tests/python/test_torch_op.py — flashattn as a PyTorch operator (docs/design.md, Python contract).

What a PyTorch user relies on beyond the numbers (which test_flashattn.py checks):
  * the custom operator torch.ops.flashattn.attention_forward / attention_backward passes
    torch.library.opcheck (schema, fake implementation, autograd registration, AOT dispatch with
    dynamic shapes), on CPU and CUDA tensors;
  * torch.compile(fullgraph=True) traces through flashattn.attention, forward and backward, and
    gives eager's results;
  * a call can be captured in a CUDA graph and replayed on new inputs;
  * CUDA calls are asynchronous on PyTorch's current stream: a call on a side stream orders after
    that stream's work and its results are there once the main stream has waited for it; the call
    returns while the GPU is still busy (no wait inside, Python or C++), and nothing in the Python
    layer synchronizes (torch.cuda.set_sync_debug_mode("error"));
  * under torch.autocast, q, k, v are cast as SDPA's are (eager and compiled);
  * tensors on different devices, and every other bad call, are ValueError/TypeError.
Tests that need PyTorch >= 2.4 (torch.library.custom_op) or a GPU skip with the reason.
Run: PYTHONPATH=<build>/python python3 -m pytest tests/python   (CTest does this).
"""
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import reference  # noqa: E402

import flashattn  # noqa: E402

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(int(os.environ.get("FLASHATTN_TEST_SEED", "2025")))
HAS_OP = hasattr(torch.library, "custom_op") and hasattr(torch.library, "register_autograd")


def needs_op():
    if not HAS_OP:
        pytest.skip(f"PyTorch {torch.__version__} has no torch.library.custom_op (2.4 or newer): "
                    f"flashattn runs through a torch.autograd.Function there")


def needs_cuda():
    if not torch.cuda.is_available() or "cuda-tc" not in flashattn.backends():
        pytest.skip("no CUDA device, or a build without the CUDA backends")


def tensors(*shapes, device="cpu", dtype=torch.float32, requires_grad=False):
    return [torch.tensor(RNG.standard_normal(s).astype(np.float32), device=device,
                         dtype=dtype).requires_grad_(requires_grad) for s in shapes]


def max_error(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    if not np.array_equal(np.isnan(out), np.isnan(ref)):
        return np.inf
    both = np.isfinite(out) & np.isfinite(ref)
    return float(np.max(np.abs(out[both] - ref[both]), initial=0.0))


# (q shape, k/v shape, options): ragged, GQA, causal, a block mask, 2-D.
def cases(device):
    mask = torch.tensor([[1, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.bool, device=device)
    return [
        ((1, 2, 7, 16), (1, 1, 11, 16), dict(causal=True)),
        ((2, 4, 13, 16), (2, 2, 13, 16), dict(scale=-0.3)),
        ((9, 16), (9, 16), dict(block_mask=mask, block_size=(3, 4))),
    ]


def op_args(q, k, v, causal=False, scale=None, backend=None, block_mask=None, block_size=None):
    return (q, k, v, causal, scale, backend, block_mask,
            None if block_size is None else list(block_size))


# --- torch.library.opcheck ------------------------------------------------------------------


@pytest.mark.parametrize("device, dtype, d", [("cpu", torch.float32, 16),
                                              ("cuda", torch.float32, 16),
                                              ("cuda", torch.bfloat16, 64),
                                              ("cuda", torch.float16, 128)])
def test_opcheck(device, dtype, d):
    needs_op()
    if device == "cuda":
        needs_cuda()
    for qs, ks, options in cases(device):
        qs, ks = qs[:-1] + (d,), ks[:-1] + (d,)
        q, k, v = tensors(qs, ks, ks, device=device, dtype=dtype, requires_grad=True)
        args = op_args(q, k, v, **options)
        torch.library.opcheck(torch.ops.flashattn.attention_forward.default, args)
        o, lse = torch.ops.flashattn.attention_forward.default(*args)
        do, = tensors(qs, device=device, dtype=dtype)
        backward_args = (q.detach(), k.detach(), v.detach(), o.detach(), lse, do) + args[3:]
        torch.library.opcheck(torch.ops.flashattn.attention_backward.default, backward_args)


def test_the_operator_itself_refuses_bad_calls():
    """torch.ops.flashattn.* may be called directly: the checks are inside the operator."""
    needs_op()
    q, k, v = tensors((1, 2, 9, 8), (1, 1, 11, 8), (1, 1, 11, 8))
    forward = torch.ops.flashattn.attention_forward.default
    with pytest.raises(ValueError, match="v "):
        forward(*op_args(q, k, v[:, :, :5]))
    with pytest.raises(ValueError, match="block_mask has shape"):
        forward(*op_args(q, k, v, block_mask=torch.ones(2, 2, dtype=torch.bool),
                         block_size=(2, 3)))
    with pytest.raises(ValueError, match="entries must be 0 or 1"):
        forward(*op_args(q, k, v, block_mask=torch.full((5, 4), 2, dtype=torch.uint8),
                         block_size=(2, 3)))
    with pytest.raises(ValueError, match="scale = "):
        forward(*op_args(q, k, v, scale=1e39))
    with pytest.raises(ValueError, match="backend = 'nope'"):
        forward(*op_args(q, k, v, backend="nope"))
    with pytest.raises(TypeError, match="different dtypes"):
        forward(*op_args(q, k.double(), v))


# --- torch.compile --------------------------------------------------------------------------


@pytest.mark.parametrize("device, dtype, d", [("cpu", torch.float32, 16),
                                              ("cuda", torch.float32, 32),
                                              ("cuda", torch.bfloat16, 64)])
def test_compile_fullgraph_forward_and_backward_match_eager(device, dtype, d):
    needs_op()
    if device == "cuda":
        needs_cuda()
    # On the CPU through AOTAutograd without code generation (no C++ compiler needed); on the GPU
    # the default, Inductor.
    backend = "aot_eager" if device == "cpu" else "inductor"
    for qs, ks, options in cases(device):
        qs, ks = qs[:-1] + (d,), ks[:-1] + (d,)
        q, k, v = tensors(qs, ks, ks, device=device, dtype=dtype)

        def loss(q_, k_, v_):
            o, lse = flashattn.attention(q_, k_, v_, return_lse=True, **options)
            return (o.float().square() * lse.exp().unsqueeze(-1).detach()).sum()

        def grads(fn):
            xs = [x.clone().requires_grad_() for x in (q, k, v)]
            value = fn(*xs)
            value.backward()
            return [value.detach()] + [x.grad for x in xs]

        torch._dynamo.reset()
        compiled = torch.compile(loss, fullgraph=True, backend=backend)  # a graph break raises
        eager, traced = grads(loss), grads(compiled)
        tolerance = dict(rtol=2e-2, atol=2e-2) if dtype != torch.float32 else dict(rtol=1e-5,
                                                                                   atol=1e-5)
        for name, a, b in zip(("loss", "dq", "dk", "dv"), eager, traced):
            torch.testing.assert_close(b, a, **tolerance, msg=f"{name} {options}")


def test_compile_of_a_module_with_autocast():
    """The GPT example's pattern: bf16 autocast, q, k, v from a Linear, fullgraph."""
    needs_op()
    needs_cuda()

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(256, 3 * 256)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, 4, 64).transpose(1, 2) for t in self.qkv(x).split(C, 2))
            return flashattn.attention(q, k, v, causal=True).transpose(1, 2).reshape(B, T, C)

    torch.manual_seed(0)
    model = Attention().cuda()
    x = torch.randn(2, 100, 256, device="cuda")
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager, traced = model(x), compiled(x)
        traced.float().sum().backward()
    assert traced.dtype == torch.bfloat16
    torch.testing.assert_close(traced, eager, rtol=2e-2, atol=2e-2)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# --- torch.autocast -------------------------------------------------------------------------


def autocast_cases():
    """(device, autocast dtype, input dtypes of q, k, v): float32 inputs, mixed ones, and float16
    under bfloat16 (which SDPA's policy casts as well)."""
    return [("cpu", torch.bfloat16, (torch.float32,) * 3),
            ("cpu", torch.bfloat16, (torch.float32, torch.bfloat16, torch.float32)),
            ("cuda", torch.bfloat16, (torch.float32,) * 3),
            ("cuda", torch.float16, (torch.float32, torch.float16, torch.float32)),
            ("cuda", torch.bfloat16, (torch.float16,) * 3)]


@pytest.mark.parametrize("device, dtype, inputs", autocast_cases())
def test_under_autocast_the_inputs_are_cast_as_sdpa_casts_them(device, dtype, inputs):
    """Under torch.autocast attention casts q, k, v to autocast's dtype first, as SDPA's policy
    (lower_precision_fp) does: O in that dtype with the bits of the same call on inputs cast by
    hand, and gradients that reach the inputs in their own dtypes, those of the hand-cast call
    cast back. Where PyTorch has SDPA, its output's dtype under the same autocast is the oracle
    of the policy itself."""
    if device == "cuda":
        needs_cuda()
    d = 64
    shapes = ((2, 4, 77, d), (2, 2, 93, d), (2, 2, 93, d))
    q, k, v = (x.to(t).requires_grad_() for x, t in
               zip(tensors(*shapes, device=device), inputs))
    do, = tensors(shapes[0], device=device, dtype=dtype)
    with torch.autocast(device, dtype=dtype):
        o = flashattn.attention(q, k, v, causal=True)
    assert o.dtype == dtype
    if hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        with torch.autocast(device, dtype=dtype):
            assert torch.nn.functional.scaled_dot_product_attention(
                q.detach()[:, :2], k.detach(), v.detach()).dtype == o.dtype
    grads = torch.autograd.grad(o, (q, k, v), do)
    assert [g.dtype for g in grads] == list(inputs)

    cast = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    o_by_hand = flashattn.attention(*cast, causal=True)  # autocast off: nothing cast again
    grads_by_hand = torch.autograd.grad(o_by_hand, cast, do)
    assert torch.equal(o, o_by_hand)
    for name, g, ref, t in zip("qkv", grads, grads_by_hand, inputs):
        # The same kernels on the same inputs; CUDA's dQ sums by atomics in any order.
        torch.testing.assert_close(g, ref.to(t), rtol=0, atol=0 if device == "cpu" else 2e-2,
                                   msg=f"d{name}")
        assert torch.isfinite(g).all()


def test_autocast_leaves_other_calls_as_they_are():
    """Outside autocast, or for tensors of another device type, or float64 (which the policy
    does not cast), nothing is cast: float32 stays float32 and float64 is still refused."""
    q, k, v = tensors((1, 2, 9, 16), (1, 1, 11, 16), (1, 1, 11, 16))
    assert flashattn.attention(q, k, v).dtype == torch.float32
    if torch.cuda.is_available():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            assert flashattn.attention(q, k, v).dtype == torch.float32  # CPU tensors
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(TypeError, match="dtype"):
            flashattn.attention(q.double(), k.double(), v.double())


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_operator_casts_under_autocast(device):
    """torch.ops.flashattn.attention_forward called under autocast (as a traced graph calls it)
    casts through its AutocastCPU/AutocastCUDA kernel: the outputs of inputs cast by hand."""
    needs_op()
    if device == "cuda":
        needs_cuda()
    q, k, v = tensors((1, 2, 70, 64), (1, 1, 90, 64), (1, 1, 90, 64), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        o, lse = torch.ops.flashattn.attention_forward.default(*op_args(q, k, v, causal=True))
    o_ref, lse_ref = torch.ops.flashattn.attention_forward.default(
        *op_args(*(x.to(torch.bfloat16) for x in (q, k, v)), causal=True))
    assert o.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)


def test_compile_under_autocast_casts_as_eager_does():
    """torch.compile(fullgraph=True) over float32 q, k, v under bfloat16 autocast: the
    operator's autocast kernel casts them in the traced graph as the eager call does (cuda-fa3
    or cuda-tc, not cuda-fa2), forward and backward."""
    needs_op()
    needs_cuda()
    q, k, v = tensors((2, 4, 150, 64), (2, 2, 150, 64), (2, 2, 150, 64), device="cuda",
                      requires_grad=True)

    def loss(q, k, v):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = flashattn.attention(q, k, v, causal=True)
        return o, (o.float() ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    eager_o, eager_loss = loss(q, k, v)
    traced_o, traced_loss = compiled(q, k, v)
    assert traced_o.dtype == eager_o.dtype == torch.bfloat16
    eager_grads = torch.autograd.grad(eager_loss, (q, k, v))
    traced_grads = torch.autograd.grad(traced_loss, (q, k, v))
    torch.testing.assert_close(traced_o, eager_o, rtol=0, atol=0)
    for name, a, b in zip("qkv", eager_grads, traced_grads):
        assert b.dtype == torch.float32
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2, msg=f"d{name}")


# --- CUDA graphs ----------------------------------------------------------------------------


def _captured(step, device):
    """(graph, outputs): step() captured in a CUDA graph on `device`, after two warm-up calls on
    a side stream there (as torch.cuda.graphs asks). The capture stream is one of that device's:
    torch.cuda.graph's default is a single stream for the whole process, made on the device
    current at its first use, and a capture on another device's stream records none of this
    device's kernels (PyTorch then warns that the graph is empty)."""
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
            outputs = step()
    return graph, outputs


@pytest.mark.parametrize("dtype, d", [(torch.float32, 32), (torch.bfloat16, 64),
                                      (torch.float16, 128)])
def test_cuda_graph_capture_and_replay_on_new_inputs(dtype, d):
    needs_cuda()
    shapes = ((2, 4, 100, d), (2, 2, 130, d), (2, 2, 130, d), (2, 4, 100, d))
    static = [x.requires_grad_(i < 3) for i, x in
              enumerate(tensors(*shapes, device="cuda", dtype=dtype))]
    mask = torch.ones(4, 3, dtype=torch.bool, device="cuda")  # on the device, as a graph needs
    mask[1, 2] = False
    options = dict(causal=True, block_mask=mask, block_size=(32, 64))

    def step():
        o = flashattn.attention(*static[:3], **options)
        return (o,) + torch.autograd.grad(o, static[:3], static[3])

    graph, outputs = _captured(step, static[0].device)
    for _ in range(2):
        fresh = tensors(*shapes, device="cuda", dtype=dtype)
        with torch.no_grad():
            for s, x in zip(static, fresh):
                s.copy_(x)
        graph.replay()
        xs = [x.requires_grad_(i < 3) for i, x in enumerate(fresh)]
        o = flashattn.attention(*xs[:3], **options)
        expected = (o,) + torch.autograd.grad(o, xs[:3], xs[3])
        torch.cuda.synchronize()
        # The forward is deterministic: the replay gives eager's bits. dQ is added with atomics.
        assert torch.equal(outputs[0], expected[0])
        for name, a, b in zip(("dq", "dk", "dv"), outputs[1:], expected[1:]):
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2, msg=name)


# --- streams and asynchrony -----------------------------------------------------------------


def _reference_check(o, q, k, v, dtype, **options):
    """O against float64 on the same (rounded) inputs: within 2x of SDPA's error (float32 eps)."""
    rounded = [x.detach().double().cpu().numpy() for x in (q, k, v)]
    ref, _ = reference.attention(*rounded, **options)
    H, Hkv = q.shape[1], k.shape[1]
    theirs = torch.nn.functional.scaled_dot_product_attention(
        q.detach(), k.detach().repeat_interleave(H // Hkv, 1),
        v.detach().repeat_interleave(H // Hkv, 1),
        attn_mask=torch.tensor(reference.visible(q.shape[2], k.shape[2], options.get("causal",
                                                                                   False)),
                               device=q.device))
    error = max_error(o.detach().double().cpu().numpy(), ref)
    bound = 2 * max_error(theirs.double().cpu().numpy(), ref) + (
        1e-6 if dtype == torch.float32 else 1e-4)
    assert error <= bound, f"error {error:.3g} > bound {bound:.3g}"


@pytest.mark.parametrize("dtype, d", [(torch.float32, 32), (torch.bfloat16, 64),
                                      (torch.bfloat16, 96)])
def test_a_call_on_a_side_stream_orders_after_its_work(dtype, d):
    """q is written on a side stream after a long sleep there; the call on that stream must read
    it after the write (launched on another stream it would read uninitialized memory), and its
    result is complete once the main stream waits for the side stream."""
    needs_cuda()
    q0, k, v = tensors((2, 4, 200, d), (2, 2, 300, d), (2, 2, 300, d), device="cuda", dtype=dtype)
    side, main = torch.cuda.Stream(), torch.cuda.current_stream()
    side.wait_stream(main)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on the side stream
        q = q0 * 1  # allocated and written on the side stream, after the sleep
        o = flashattn.attention(q, k, v, causal=True)
    main.wait_stream(side)
    o = o.clone()  # on the main stream, after the wait
    torch.cuda.synchronize()
    _reference_check(o, q0, k, v, dtype, causal=True)


@pytest.mark.parametrize("dtype, d", [(torch.float32, 32), (torch.bfloat16, 64)])
def test_calls_return_while_the_gpu_is_busy(dtype, d):
    """A call that waited for the stream or the device (cudaStreamSynchronize, a copy to the host)
    would return only after the sleep queued before it: the stream must still be busy when
    forward and backward return, and the results right once it has run."""
    needs_cuda()
    q, k, v, do = tensors((2, 4, 300, d), (2, 2, 300, d), (2, 2, 300, d), (2, 4, 300, d),
                          device="cuda", dtype=dtype)
    q.requires_grad_()
    flashattn.attention(q, k, v, causal=True).backward(do)  # warm-up: module loads, attributes
    torch.cuda.synchronize()
    q.grad = None
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(1_000_000_000)  # ~0.5 s of GPU time
    start = time.perf_counter()
    o = flashattn.attention(q, k, v, causal=True)
    o.backward(do)
    returned = time.perf_counter() - start
    busy = not stream.query()
    torch.cuda.synchronize()
    assert busy, f"forward and backward returned after the GPU had finished ({returned:.3f} s)"
    _reference_check(o, q, k, v, dtype, causal=True)
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_nothing_in_python_synchronizes():
    """torch.cuda.set_sync_debug_mode("error") raises at any synchronizing PyTorch call (.item(),
    .cpu(), a blocking copy): forward, backward, a host block mask and a device one."""
    needs_cuda()
    q, k, v, do = tensors((1, 4, 100, 64), (1, 2, 90, 64), (1, 2, 90, 64), (1, 4, 100, 64),
                          device="cuda", dtype=torch.bfloat16)
    q.requires_grad_()
    host_mask = np.ones((4, 2), dtype=bool)
    device_mask = torch.ones(4, 2, dtype=torch.bool, device="cuda")
    flashattn.attention(q, k, v).backward(do)  # warm-up outside the mode (first-use setup)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for mask in (None, host_mask, device_mask):
            options = dict(block_mask=mask, block_size=(32, 64)) if mask is not None else {}
            o, lse = flashattn.attention(q, k, v, causal=True, return_lse=True, **options)
            o.backward(do)
            flashattn.attention_backward(q.detach(), k, v, o.detach(), lse, do, causal=True,
                                         **options)
            flashattn.attention(q.float(), k.float(), v.float(), causal=True)  # cuda-fa2
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


# --- devices and masks ----------------------------------------------------------------------


def test_tensors_on_different_devices_are_refused():
    needs_cuda()
    q, k, v = tensors((1, 2, 9, 64), (1, 1, 11, 64), (1, 1, 11, 64), device="cuda",
                      dtype=torch.float16)
    o, lse = flashattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="different devices"):
        flashattn.attention(q, k.cpu(), v)
    with pytest.raises(ValueError, match="different devices"):
        flashattn.attention(q.cpu(), k, v.cpu())
    with pytest.raises(ValueError, match="different devices"):
        flashattn.attention_backward(q, k, v, o.cpu(), lse, o)
    with pytest.raises(ValueError, match="q, lse are on different devices"):
        flashattn.attention_backward(q, k, v, o, lse.cpu(), o)
    with pytest.raises(ValueError, match="different devices"):  # with autograd too
        flashattn.attention(q.requires_grad_(), k.cpu(), v)
    if torch.cuda.device_count() > 1:
        with pytest.raises(ValueError, match="different devices"):
            flashattn.attention(q, k.to("cuda:1"), v)


def needs_two_gpus():
    needs_cuda()
    if torch.cuda.device_count() < 2:
        pytest.skip("one GPU")


def _gradient_check(grads, q, k, v, do, causal):
    """Gradients against float64 on the same rounded inputs: within 2x of SDPA's own error (on
    the same device), plus a floor of a hundredth of the dtype's unit roundoff times the
    gradient's largest entry."""
    H, Hkv = q.shape[1], k.shape[1]
    ys = [x.detach().clone().requires_grad_() for x in (q, k, v)]
    mask = torch.tensor(reference.visible(q.shape[2], k.shape[2], causal), device=q.device)
    torch.nn.functional.scaled_dot_product_attention(
        ys[0], ys[1].repeat_interleave(H // Hkv, 1), ys[2].repeat_interleave(H // Hkv, 1),
        attn_mask=mask).backward(do)
    rounded = [x.detach().double().cpu().numpy() for x in (q, k, v, do)]
    refs = reference.attention_backward(*rounded, causal=causal)
    unit = {torch.float32: 2**-24, torch.float16: 2**-11, torch.bfloat16: 2**-8}[q.dtype]
    for name, g, y, ref in zip("QKV", grads, ys, refs):
        assert g.device == q.device and g.dtype == q.dtype, name
        error = max_error(g.double().cpu().numpy(), ref)
        bound = 2 * max_error(y.grad.double().cpu().numpy(), ref) + unit * np.abs(ref).max() / 100
        assert error <= bound, f"d{name}: error {error:.3g} > bound {bound:.3g}"


# Each default CUDA backend (test_the_default_backend_is_the_fastest_for_the_device): float32 on
# cuda-fa2, 16-bit on cuda-fa3 (Hopper) or cuda-tc, a decoding forward (one query row) on
# cuda-tc's split keys. (q rows, kv rows, d, dtype).
SECOND_GPU_CASES = [(50, 70, 32, torch.float32), (150, 203, 64, torch.bfloat16),
                    (97, 131, 128, torch.float16), (77, 77, 96, torch.bfloat16),
                    (1, 700, 64, torch.bfloat16)]


@pytest.mark.parametrize("nq, nkv, d, dtype", SECOND_GPU_CASES)
def test_tensors_on_a_second_gpu_run_there(nq, nkv, d, dtype):
    """Tensors on cuda:1 while cuda:0 is current: forward and backward run on cuda:1, on its
    current stream, their outputs are there and right against float64 (the kernels of another
    device's launch would read cuda:1's memory from cuda:0, or not launch at all), and the
    current device is left as it was."""
    needs_two_gpus()
    torch.cuda.set_device(0)
    device = torch.device("cuda", 1)
    q, k, v, do = tensors((1, 4, nq, d), (1, 2, nkv, d), (1, 2, nkv, d), (1, 4, nq, d),
                          device=device, dtype=dtype)
    expected = flashattn._default_cuda_backend(flashattn._TORCH_DTYPES[dtype], device,
                                               tuple(q.shape), False)
    causal = nq > 1
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    side = torch.cuda.Stream(device)  # cuda:1's current stream, not cuda:0's
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        o = flashattn.attention(*xs, causal=causal)
        o.backward(do)
    torch.cuda.current_stream(device).wait_stream(side)
    assert torch.cuda.current_device() == 0
    assert o.device == device and o.dtype == dtype
    torch.cuda.synchronize(device)
    _reference_check(o, q, k, v, dtype, causal=causal)
    _gradient_check([x.grad for x in xs], q, k, v, do, causal)
    # The default named the backend that ran: naming it gives the same bits.
    assert torch.equal(o, flashattn.attention(q, k, v, causal=causal, backend=expected))


def test_a_second_gpu_under_compile_and_cuda_graphs():
    """On cuda:1 (cuda:0 current): torch.compile(fullgraph=True) gives eager's results, forward
    and backward, and a CUDA graph captured there replays right on new inputs."""
    needs_two_gpus()
    needs_op()
    torch.cuda.set_device(0)
    device = torch.device("cuda", 1)
    shapes = ((2, 4, 100, 64), (2, 2, 130, 64), (2, 2, 130, 64), (2, 4, 100, 64))
    q, k, v, do = tensors(*shapes, device=device, dtype=torch.bfloat16)

    def loss(q, k, v):
        return (flashattn.attention(q, k, v, causal=True) * do).sum()

    compiled = torch.compile(loss, fullgraph=True)
    for f in (loss, compiled):
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        f(*xs).backward()
        if f is loss:
            eager = [x.grad for x in xs]
        else:
            for name, a, b in zip("QKV", (x.grad for x in xs), eager):
                torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2, msg=f"d{name}")

    static = [x.clone().requires_grad_(i < 3) for i, x in enumerate((q, k, v, do))]

    def step():
        o = flashattn.attention(*static[:3], causal=True)
        return (o,) + torch.autograd.grad(o, static[:3], static[3])

    graph, outputs = _captured(step, device)
    fresh = tensors(*shapes, device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        for s, x in zip(static, fresh):
            s.copy_(x)
    graph.replay()
    torch.cuda.synchronize(device)
    assert torch.cuda.current_device() == 0
    _reference_check(outputs[0], *fresh[:3], torch.bfloat16, causal=True)
    _gradient_check(outputs[1:], *fresh, causal=True)


@pytest.mark.parametrize("dtype, d", [(torch.float32, 16), (torch.bfloat16, 64)])
def test_block_masks_from_the_host_and_on_the_device(dtype, d):
    """The same mask as NumPy, a CPU tensor, a CUDA bool tensor and a CUDA uint8 tensor whose
    nonzero entries are 2 (the kernels read nonzero as visible) gives the same O, right against
    float64; a block row that is all 0 gives O = 0 and LSE = -inf."""
    needs_cuda()
    q, k, v = tensors((2, 2, 37, d), (2, 1, 53, d), (2, 1, 53, d), device="cuda", dtype=dtype)
    mask = RNG.integers(0, 2, size=(5, 4)).astype(bool)
    mask[0, 0], mask[2] = True, False  # rows 16..23 see nothing
    size = (8, 16)
    outputs = []
    for given in (mask, torch.tensor(mask), torch.tensor(mask, device="cuda"),
                  torch.tensor(mask.astype(np.uint8) * 2, device="cuda")):
        outputs.append(flashattn.attention(q, k, v, block_mask=given, block_size=size,
                                           return_lse=True))
    for o, lse in outputs[1:]:
        assert torch.equal(o, outputs[0][0]) and torch.equal(lse, outputs[0][1])
    o, lse = outputs[0]
    assert (o[:, :, 16:24] == 0).all() and (lse[:, :, 16:24] == -np.inf).all()
    rounded = [x.double().cpu().numpy() for x in (q, k, v)]
    ref, _ = reference.attention(*rounded, block_mask=mask, block_size=size)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert max_error(o.double().cpu().numpy(), ref) < tolerance


def projection_views(B, N, H, d, dtype, offset=0):
    """x of shape (B, N, offset + 3 H d) and q, k, v cut from it as a model cuts them from one
    projection: (B, H, N, d) views whose rows lie offset + 3 H d elements apart and heads d apart.
    """
    x, = tensors((B, N, offset + 3 * H * d), device="cuda", dtype=dtype)
    x.requires_grad_()
    return x, [t.view(B, N, H, d).transpose(1, 2) for t in x[..., offset:].split(H * d, dim=2)]


@pytest.mark.parametrize("dtype, d, offset", [(torch.bfloat16, 64, 0), (torch.float16, 128, 0),
                                              (torch.bfloat16, 64, 4)])
def test_cuda_fa3_reads_projection_views_where_they_lie(dtype, d, offset, monkeypatch):
    """q, k, v cut from one projection: cuda-fa3 reads them where they lie (offset 0) or from
    contiguous copies (offset 4: an address and strides TMA cannot read), forward and backward,
    writes O and the gradients in q's dtype in q's (B, N, H, d) order, and O, LSE and the
    gradients are the bits of the same calls on contiguous copies. The fake implementations give
    the outputs the same strides (opcheck)."""
    needs_cuda()
    if "cuda-fa3" not in flashattn.backends():
        pytest.skip("cuda-fa3 needs an sm_90a build on a Hopper GPU")
    monkeypatch.setenv("FLASHATTN_DETERMINISTIC", "1")  # dQ's atomics in a fixed order
    B, N, H = 2, 200, 3
    x, (q, k, v) = projection_views(B, N, H, d, dtype, offset)
    o, lse = flashattn.attention(q, k, v, causal=True, backend="cuda-fa3", return_lse=True)
    assert o.shape == q.shape and o.dtype == dtype
    assert o.stride() == (N * H * d, d, H * d, 1)  # (B, N, H, d) in memory
    do, = tensors(q.shape, device="cuda", dtype=dtype)
    o.backward(do)

    y = x.detach().clone().requires_grad_()
    qc, kc, vc = (t.view(B, N, H, d).transpose(1, 2).contiguous()
                  for t in y[..., offset:].split(H * d, dim=2))
    o_ref, lse_ref = flashattn.attention(qc, kc, vc, causal=True, backend="cuda-fa3",
                                         return_lse=True)
    assert o_ref.is_contiguous()
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)
    o_ref.backward(do)
    assert torch.equal(x.grad, y.grad)
    if HAS_OP:  # the fake implementations give the outputs the real ones' strides
        views = [t.detach() for t in (q, k, v)]
        args = op_args(*views, causal=True, backend="cuda-fa3")
        torch.library.opcheck(torch.ops.flashattn.attention_forward.default, args)
        torch.library.opcheck(torch.ops.flashattn.attention_backward.default,
                              (*views, o.detach(), lse, do) + args[3:])


def test_cuda_fa3_gradients_at_head_dim_256():
    """cuda-fa3's backward at d = 256 (its warpgroups split d) through autograd, GQA, causal, odd
    lengths: within 2x of SDPA's own error against float64 on the same rounded inputs
    (_gradient_check)."""
    needs_cuda()
    if "cuda-fa3" not in flashattn.backends():
        pytest.skip("no cuda-fa3 (a build without sm_90a, or not a Hopper GPU)")
    q, k, v, do = tensors((1, 4, 150, 256), (1, 2, 203, 256), (1, 2, 203, 256), (1, 4, 150, 256),
                          device="cuda", dtype=torch.bfloat16)
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    flashattn.attention(*xs, causal=True, backend="cuda-fa3").backward(do)
    _gradient_check([x.grad for x in xs], q, k, v, do, causal=True)


def test_the_default_backend_is_the_fastest_for_the_device():
    """float32 on cuda-fa2; float16/bfloat16 on cuda-fa3 on Hopper for d = 64, 128 and 256 (its
    backward too), else cuda-tc, and cuda-tc for a decoding forward (at most 64 query rows), whose
    keys it splits; the default gives the same bits as naming that backend."""
    needs_cuda()
    device = torch.device("cuda", torch.cuda.current_device())
    hopper = torch.cuda.get_device_capability(device) == (9, 0)
    fa3 = "cuda-fa3" in flashattn.backends() and hopper
    for dtype, d, rows, expected in ((torch.float32, 64, 300, "cuda-fa2"),
                                     (torch.bfloat16, 64, 300, "cuda-fa3" if fa3 else "cuda-tc"),
                                     (torch.float16, 128, 300, "cuda-fa3" if fa3 else "cuda-tc"),
                                     (torch.bfloat16, 96, 300, "cuda-tc"),
                                     (torch.float16, 256, 300, "cuda-fa3" if fa3 else "cuda-tc"),
                                     (torch.float16, 128, 1, "cuda-tc"),
                                     (torch.bfloat16, 64, 64, "cuda-tc"),
                                     (torch.bfloat16, 64, 65, "cuda-fa3" if fa3 else "cuda-tc")):
        name = flashattn._TORCH_DTYPES[dtype]
        shape = (1, 4, rows, d)
        assert flashattn._default_cuda_backend(name, device, shape, False) == expected
        if d == 256:  # the backward's default as the forward's (cuda-tc has none at d = 256)
            assert flashattn._default_cuda_backend(name, device, shape, True) == expected
        q, k, v = tensors(shape, (1, 2, 300, d), (1, 2, 300, d), device="cuda", dtype=dtype)
        assert torch.equal(flashattn.attention(q, k, v, causal=True),
                           flashattn.attention(q, k, v, causal=True, backend=expected))
    if fa3:  # a forward on cuda-fa3, its gradients from cuda-tc's backward
        q, k, v, do = tensors((1, 4, 300, 64), (1, 4, 300, 64), (1, 4, 300, 64), (1, 4, 300, 64),
                              device="cuda", dtype=torch.bfloat16)
        xs = [x.clone().requires_grad_() for x in (q, k, v)]
        flashattn.attention(*xs, causal=True, backend="cuda-fa3").backward(do)
        ys = [x.clone().requires_grad_() for x in (q, k, v)]
        flashattn.attention(*ys, causal=True, backend="cuda-tc").backward(do)
        for x, y in zip(xs, ys):
            torch.testing.assert_close(x.grad, y.grad, rtol=2e-2, atol=2e-2)
