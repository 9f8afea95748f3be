"""flashattn.distributed — ring attention: one sequence sharded over several devices.

Ring attention (Liu et al., 2023, "Ring Attention with Blockwise Transformers", arXiv 2310.01889)
is FlashAttention's Algorithm 1 (arXiv 2205.14135) with its outer loop, over K/V blocks j, run
across devices. Each of the W ranks of a process group holds one shard of the sequence: its queries
Q_r stay where they are, its K/V block travels around the ring (rank r sends to r + 1 and receives
from r - 1), and after W steps every rank has met every block. Where Algorithm 1 folds a block's
scores into the running (m_i, l_i) (lines 10-12), a rank folds a block's whole partial result
(O, LSE) into its running one with flashattn.merge_partials: the same rule, applied to parts that
are already normalized (common/online_softmax.hpp). docs/ring_attention.md teaches it and models
how it scales.

    import torch.distributed as dist
    from flashattn.distributed import ring_attention, shard_indices
    idx = shard_indices(n, dist.get_world_size(), dist.get_rank(), layout="zigzag")
    o = ring_attention(q[:, :, idx], k[:, :, idx], v[:, :, idx], causal=True, layout="zigzag")

Shapes: q is this rank's (B, H, N_local, d), k and v (B, H_kv, N_local, d), H % H_kv == 0; every
rank passes the same shapes, dtype and options. Layouts (which tokens a rank holds;
shard_indices gives them): "contiguous", rank r holds tokens [r c, (r + 1) c) with c = n / W;
"zigzag", the sequence in 2W chunks and rank r holds chunks r and 2W - 1 - r, so that under a
causal mask every rank does the same work.

Transport: torch.distributed point-to-point (batch_isend_irecv), gloo for CPU tensors, NCCL for
CUDA tensors. Each step starts sending the block it holds and receiving the next before it
computes, so the transfer overlaps the block's attention.
"""
try:
    import torch
    import torch.distributed as dist
except ImportError as error:  # `import flashattn` itself needs no PyTorch; this module does
    raise ImportError("flashattn.distributed needs PyTorch with torch.distributed (Debian: "
                      "python3-torch); `import flashattn` works without it") from error
if not dist.is_available():
    raise ImportError("flashattn.distributed needs torch.distributed, and this PyTorch was built "
                      "without it")

import math

from . import (_C, _autocast, _check_backend, _check_bool, _check_options, _check_shapes,
               _check_tensors, _cuda_backend, attention, attention_backward, merge_partials)

_SCORE_LIMIT = _C.score_limit  # common/score_range.hpp's kScoreLimit


def _max_finite_row_norm(x):
    """The largest Euclidean norm over the rows (last axis) of x whose elements are all finite, in
    float64 (a float32 sum of squares would overflow long before the scores do)."""
    squares = x.detach().to(torch.float64).square().sum(-1).flatten()
    squares = squares[squares.isfinite()]
    return math.sqrt(squares.max().item()) if squares.numel() else 0.0


def _max_finite_abs(x):
    """The largest |element| of x over its finite elements (0 when there is none). Non-finite
    elements count as 0 (nan_to_num), not as removed: selecting the finite ones (x[x.isfinite()])
    copied them one by one and took about 10 ns an element on a CPU core, ten times this."""
    x = x.detach()
    if x.numel() == 0:
        return 0.0
    return float(torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0).max().item())

__all__ = ["ring_attention", "shard_indices"]

LAYOUTS = ("contiguous", "zigzag")


# --- which tokens a rank holds --------------------------------------------------------------


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < low:
        raise ValueError(f"{name} = {value}: must be at least {low}")
    return value


def _check_layout(layout):
    if layout not in LAYOUTS:
        raise ValueError(f"layout = {layout!r}: must be one of {', '.join(map(repr, LAYOUTS))}")
    return layout


def shard_indices(n, world_size, rank, layout="contiguous"):
    """The token indices (a LongTensor, increasing) that `rank` of `world_size` holds of a
    sequence of n tokens: x[..., shard_indices(...), :] is its shard, and writing each rank's
    result back at its indices un-shards.

    "contiguous": n / world_size consecutive tokens per rank. "zigzag": the sequence cut into
    2 world_size chunks of c = n / (2 world_size) tokens, rank r holding chunks r and
    2 world_size - 1 - r (an early and a late one: under a causal mask every rank then has the
    same number of visible (query, key) pairs)."""
    n, world_size = _check_int("n", n, 1), _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0)
    if rank >= world_size:
        raise ValueError(f"rank = {rank}: must be less than world_size = {world_size}")
    chunks = world_size * (2 if _check_layout(layout) == "zigzag" else 1)
    if n % chunks:
        raise ValueError(f"n = {n}: layout {layout!r} cuts the sequence into {chunks} equal "
                         f"chunks for world_size = {world_size}, so n must be a multiple of "
                         f"{chunks}")
    c = n // chunks
    if layout == "contiguous":
        return torch.arange(rank * c, (rank + 1) * c)
    late = 2 * world_size - 1 - rank
    return torch.cat((torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)))


# --- one step of the ring: which part of the block is visible --------------------------------


def _block_plan(causal, layout, rank, src, n_local):
    """What rank `rank` computes with the K/V block of rank `src` (both of one ring): a triple
    (query rows, key rows, causal) of slices into the local shards, or None when no query of this
    rank may see a key of that block (the step is skipped; the block is still passed on).

    Without a mask every query sees every key. With the causal mask, the block of the rank itself
    holds the same tokens as its queries (N_q = N_kv), so its causal mask is the local lower
    triangle. Contiguous: the blocks of earlier ranks hold earlier tokens (all visible), those
    of later ranks later ones (none). Zigzag: each side holds an early chunk and a late chunk;
    of the four (query chunk, key chunk) pairs one is diagonal or empty for src != rank:
      src < rank: key chunk src precedes both query chunks, key chunk 2W-1-src follows both
                  -> all queries, the first half of the keys;
      src > rank: query chunk rank precedes both key chunks, query chunk 2W-1-rank follows both
                  -> the second half of the queries, all keys.
    Either way half of the block, the same work as the causal diagonal block."""
    everything = slice(None)
    if not causal:
        return everything, everything, False
    if src == rank:
        return everything, everything, True
    if layout == "contiguous":
        return (everything, everything, False) if src < rank else None
    half = n_local // 2
    if src < rank:
        return everything, slice(0, half), False
    return slice(half, None), everything, False


# --- the ring's transport -------------------------------------------------------------------

_KV_TAG, _DKV_TAG = 0, 1  # the K/V blocks and the backward's dK/dV, told apart on gloo


class _Ring:
    """Point-to-point with this rank's neighbours in `group`: send to rank + 1, receive from
    rank - 1, both started at once (batch_isend_irecv) and finished by wait(). A ring of one rank
    sends to itself: a copy."""

    def __init__(self, group):
        self.group = group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.next = self._global((self.rank + 1) % self.size)
        self.prev = self._global((self.rank - 1) % self.size)

    def _global(self, group_rank):  # P2POp takes ranks of the default group
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def start(self, send, recv, tag):
        if self.size == 1:
            recv.copy_(send)
            return []
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.next, self.group, tag),
                                       dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)])

    @staticmethod
    def wait(requests):
        for request in requests:
            request.wait()


# --- forward and backward -------------------------------------------------------------------


def _ring_forward(q, k, v, causal, scale, layout, group, backend):
    """This rank's O (float32) and LSE over the whole sequence (Algorithm 1, outer loop over the
    ring's blocks)."""
    ring = _Ring(group)
    kv = torch.stack((k, v))  # K_j and V_j travel as one message
    out = lse = None
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size  # whose block this rank holds at this step
        if step + 1 < ring.size:  # pass the block on while computing with it
            kv_next = torch.empty_like(kv)
            transfer = ring.start(kv, kv_next, _KV_TAG)
        plan = _block_plan(causal, layout, ring.rank, src, q.shape[-2])
        if plan is not None:
            rows, keys, block_causal = plan
            o, l = attention(q[..., rows, :], kv[0][..., keys, :], kv[1][..., keys, :],
                             causal=block_causal, scale=scale, backend=backend, return_lse=True)
            o = o.float()  # the running O stays float32 whatever the inputs' dtype
            if out is None:  # step 0, the rank's own block: every row
                out, lse = o, l
            else:  # Algorithm 1 lines 10-12, a whole block at once: the LSE merge
                out[..., rows, :], lse[..., rows] = merge_partials(
                    [out[..., rows, :], o], [lse[..., rows], l])
        if step + 1 < ring.size:
            ring.wait(transfer)
            kv = kv_next
    return out, lse


def _ring_backward(do, q, k, v, out, lse, causal, scale, layout, group, backend):
    """dQ, dK, dV of this rank's shards. The K/V blocks go around the ring again, each with the
    dK, dV accumulated for it so far; every block's backward reads the global O and LSE, which
    makes its P_ij = exp(S_ij - LSE_i) the final softmax and D_i = rowsum(dO_i o O_i) the final
    one, so each block's gradients are its exact share (no second merge). dQ stays here, summed
    in float32; a block's dK, dV arrive at their owner after W steps."""
    ring = _Ring(group)
    o = out.to(q.dtype)  # attention_backward reads O in the inputs' dtype (float32: no copy)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv = torch.stack((k, v))
    dkv_transfer = []
    for step in range(ring.size):
        src = (ring.rank - step) % ring.size
        if step + 1 < ring.size:
            kv_next = torch.empty_like(kv)
            kv_transfer = ring.start(kv, kv_next, _KV_TAG)
        plan = _block_plan(causal, layout, ring.rank, src, q.shape[-2])
        if plan is not None:
            rows, keys, block_causal = plan
            dq_block, dk_block, dv_block = attention_backward(
                q[..., rows, :], kv[0][..., keys, :], kv[1][..., keys, :], o[..., rows, :],
                lse[..., rows], do[..., rows, :], causal=block_causal, scale=scale,
                backend=backend)
            dq[..., rows, :] += dq_block
        # The block's dK, dV as the ranks before this one left them (zero at its owner, step 0);
        # their transfer overlapped this step's backward.
        if step == 0:
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        else:
            ring.wait(dkv_transfer)
            dkv = dkv_next
        if plan is not None:
            dkv[0][..., keys, :] += dk_block
            dkv[1][..., keys, :] += dv_block
        dkv_next = torch.empty_like(dkv)  # after the last step: this rank's own block's, complete
        dkv_transfer = ring.start(dkv, dkv_next, _DKV_TAG)
        if step + 1 < ring.size:
            ring.wait(kv_transfer)
            kv = kv_next
    ring.wait(dkv_transfer)
    return dq.to(q.dtype), dkv_next[0].to(k.dtype), dkv_next[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, group, backend):
        out, lse = _ring_forward(q, k, v, causal, scale, layout, group, backend)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, scale, layout, group, backend)
        ctx.mark_non_differentiable(lse)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(do.contiguous(), q, k, v, out, lse, *ctx.options)
        return dq, dk, dv, None, None, None, None, None


# --- arguments, checked on every rank together -----------------------------------------------
#
# A rank that raised while the others went on would leave them waiting for it forever. So each
# rank checks its own arguments, then all ranks exchange what they found (one all_gather_object)
# and decide together: a problem anywhere raises the same error on every rank, before any block
# is sent.


def _check_transport(transport, q):
    """The process group's backend must move q's kind of tensor point to point (ValueError)."""
    if transport == "nccl" and not q.is_cuda:
        raise ValueError(f"q is on {q.device}: the process group's backend is nccl, which moves "
                         f"CUDA tensors (use a gloo group for CPU tensors)")
    if transport == "gloo" and q.is_cuda:
        raise ValueError(f"q is on {q.device}: the process group's backend is gloo, whose "
                         f"point-to-point moves CPU tensors (use an nccl group for CUDA tensors)")


def _local_check(q, k, v, causal, scale, layout, backend, return_lse, transport):
    """This rank's arguments alone, checked as flashattn.attention checks them, plus what the
    ring needs; returns what must agree across ranks, as (argument, value) pairs."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}: ring_attention "
                            f"exchanges tensors through torch.distributed")
    dtype = _check_tensors(("q", "k", "v"), (q, k, v))
    Qs, Ks = _check_shapes(q.shape, k.shape, v.shape)
    if Qs[2] != Ks[2]:
        raise ValueError(f"q has N_local = {Qs[2]} tokens and k, v {Ks[2]}: a rank's queries and "
                         f"keys are the same tokens of the sequence")
    causal, _, _, _, _ = _check_options(Qs, Ks, causal, scale, None, None)
    if _check_layout(layout) == "zigzag" and Qs[2] % 2:
        raise ValueError(f"layout = 'zigzag' holds two chunks per rank, of n / (2 world_size) "
                         f"tokens, so N_local must be even: q has N_local = {Qs[2]} (the world "
                         f"size does not divide the sequence into 2 world_size chunks)")
    backend = (_cuda_backend(backend, dtype, q.device, Qs, backward=False) if q.is_cuda
               else _check_backend(backend))
    _check_bool("return_lse", return_lse)
    _check_transport(transport, q)
    grad = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
    return [("q shape", tuple(q.shape)), ("k shape", tuple(k.shape)),
            ("v shape", tuple(v.shape)), ("q dtype", str(q.dtype)),
            ("q device type", q.device.type), ("causal", causal),
            ("scale", None if scale is None else float(scale)), ("layout", layout),
            ("backend", backend), ("q, k, v requires_grad (with grad mode on)", grad)]


def _raise_everywhere(kind, message):
    raise {"TypeError": TypeError, "ValueError": ValueError}.get(kind, RuntimeError)(message)


def _check_collectively(q, k, v, causal, scale, layout, group, backend, return_lse):
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group first")
    transport = dist.get_backend(group)
    try:
        found = ("ok", _local_check(q, k, v, causal, scale, layout, backend, return_lse,
                                    transport),
                 _max_finite_abs(q), _max_finite_abs(k))
    except Exception as error:  # noqa: BLE001 -- any failure must reach every rank, or they hang
        found = (type(error).__name__, str(error), 0.0, 0.0)
    everyone = [None] * dist.get_world_size(group)
    device = q.device if isinstance(q, torch.Tensor) and q.is_cuda else None
    with torch.cuda.device(device) if device is not None else _nothing():
        dist.all_gather_object(everyone, found, group=group)  # NCCL: on q's device
    for rank, (kind, detail, _, _) in enumerate(everyone):
        if kind != "ok":
            _raise_everywhere(kind, f"ring_attention, rank {rank}: {detail}")
    ours = everyone[0][1]
    for rank, (_, theirs, _, _) in enumerate(everyone):
        for (name, a), (_, b) in zip(ours, theirs):
            if a != b:
                raise ValueError(f"ring_attention: {name} differ across ranks: {a} on rank 0, "
                                 f"{b} on rank {rank}; every rank must pass the same")
    # Scores that float32 cannot hold: the library refuses them per call, and a refusal at one
    # step on one rank would strand the others. The bound (common/score_range.hpp) over the whole
    # sequence is that of single-process attention on it; max|x| first, row norms if needed.
    d, scale_value = q.shape[-1], dict(ours)["scale"]
    factor = max(1.0, abs(scale_value) if scale_value is not None else d ** -0.5)
    if factor * d * max(e[2] for e in everyone) * max(e[3] for e in everyone) <= _SCORE_LIMIT:
        return
    norms = [None] * len(everyone)
    with torch.cuda.device(device) if device is not None else _nothing():
        dist.all_gather_object(norms, (_max_finite_row_norm(q), _max_finite_row_norm(k)),
                               group=group)
    bound = factor * max(n[0] for n in norms) * max(n[1] for n in norms)
    if bound > _SCORE_LIMIT:
        raise ValueError(f"scale = {scale_value if scale_value is not None else d ** -0.5:g}: the "
                         f"scores scale * q.k over the whole sequence can reach {bound:.3g} in "
                         f"magnitude, beyond what float32 holds (limit {_SCORE_LIMIT:.3g}). Use a "
                         f"smaller |scale| or rescale Q and K")


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


# --- the API --------------------------------------------------------------------------------


def ring_attention(q, k, v, *, causal=False, scale=None, layout="contiguous", group=None,
                   backend=None, return_lse=False):
    """Attention over a sequence sharded across the ranks of `group` (default: the whole world).

    q: this rank's (B, H, N_local, d) queries; k, v: its (B, H_kv, N_local, d) keys and values,
    the same tokens (shard_indices(n, W, rank, layout) gives which). torch tensors, CPU with a
    gloo group, CUDA with an nccl one; every rank passes the same shapes, dtype and options.
    causal: the causal mask of the whole sequence (token i sees token j iff j <= i).
    scale, backend: as in flashattn.attention (backend: the package's default for the device).
    layout: "contiguous" or "zigzag" (see shard_indices; zigzag balances causal work).
    return_lse: also return LSE over the whole sequence, float32, shape (B, H, N_local).

    Under torch.autocast, q, k, v are cast first as flashattn.attention casts them.

    Returns this rank's O (q's shape and dtype), or (O, LSE). With inputs that require grad,
    gradients flow through the ring backward (each rank's dQ, dK, dV for its own shards). Every
    rank must call it, and call backward, together. Bad arguments on any rank raise ValueError
    or TypeError on every rank.
    """
    if all(isinstance(x, torch.Tensor) for x in (q, k, v)):
        q, k, v = _autocast(q, k, v)  # as flashattn.attention's inputs under torch.autocast
    _check_collectively(q, k, v, causal, scale, layout, group, backend, return_lse)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        out, lse = _RingAttention.apply(q, k, v, causal, scale, layout, group, backend)
    else:
        out, lse = _ring_forward(q, k, v, causal, scale, layout, group, backend)
        out = out.to(q.dtype)
    return (out, lse) if return_lse else out
