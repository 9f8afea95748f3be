"""tests/python/reference.py — standard attention and its backward in NumPy, written independently of
the library: the float64 reference and the float32 yardstick of the 2x rule (docs/design.md)."""
import numpy as np


def visible(Nq, Nkv, causal, block_mask=None, block_size=None):
    """(Nq, Nkv) bool: may query i attend key j (bottom-right causal, block mask)."""
    i = np.arange(Nq)[:, None]
    j = np.arange(Nkv)[None, :]
    ok = np.ones((Nq, Nkv), dtype=bool)
    if causal:
        ok &= j <= i + (Nkv - Nq)
    if block_mask is not None:
        Br, Bc = block_size
        ok &= np.asarray(block_mask, dtype=bool)[i // Br, j // Bc]
    return ok


def _expand(x, H):
    """K/V heads repeated for their query heads (GQA): (B, Hkv, N, d) -> (B, H, N, d)."""
    return np.repeat(x, H // x.shape[1], axis=1)


def _softmax(S, ok):
    """P = softmax over the visible keys of each row of S (0 elsewhere; a row with no visible key
    is all 0), and LSE (-inf for such a row)."""
    S = np.where(ok, S, -np.inf)
    m = S.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0)
    P = np.where(ok, np.exp(S - m_safe), 0)
    l = P.sum(axis=-1, keepdims=True)
    P = np.where(l > 0, P / np.where(l > 0, l, 1), 0)
    with np.errstate(divide="ignore"):
        lse = np.where(l[..., 0] > 0, (m_safe + np.log(np.where(l > 0, l, 1)))[..., 0], -np.inf)
    return P, lse


def attention(q, k, v, dtype=np.float64, causal=False, scale=None, block_mask=None,
              block_size=None):
    """O and LSE of (B, H, N, d) inputs, computed in `dtype`."""
    q, k, v = (np.asarray(x, dtype=dtype) for x in (q, k, v))
    H, Nq, d = q.shape[1], q.shape[2], q.shape[3]
    Nkv = k.shape[2]
    scale = dtype(1.0 / np.sqrt(d)) if scale is None else dtype(scale)
    K, V = _expand(k, H), _expand(v, H)
    ok = visible(Nq, Nkv, causal, block_mask, block_size)
    P, lse = _softmax(scale * np.einsum("bhid,bhjd->bhij", q, K), ok)
    return np.einsum("bhij,bhjd->bhid", P, V), lse


def attention_backward(q, k, v, do, dtype=np.float64, causal=False, scale=None, block_mask=None,
                       block_size=None):
    """dQ, dK, dV of sum(O o dO) by the paper's Algorithm 3, in `dtype`."""
    q, k, v, do = (np.asarray(x, dtype=dtype) for x in (q, k, v, do))
    B, H, Nq, d = q.shape
    Hkv, Nkv = k.shape[1], k.shape[2]
    scale = dtype(1.0 / np.sqrt(d)) if scale is None else dtype(scale)
    K, V = _expand(k, H), _expand(v, H)
    ok = visible(Nq, Nkv, causal, block_mask, block_size)
    P, _ = _softmax(scale * np.einsum("bhid,bhjd->bhij", q, K), ok)
    dV = np.einsum("bhij,bhid->bhjd", P, do)
    dP = np.einsum("bhid,bhjd->bhij", do, V)
    D = (P * dP).sum(axis=-1, keepdims=True)
    dS = np.where(ok, P * (dP - D), 0)
    dQ = scale * np.einsum("bhij,bhjd->bhid", dS, K)
    dK = scale * np.einsum("bhij,bhid->bhjd", dS, q)
    g = H // Hkv  # sum over the query heads of a group
    dK = dK.reshape(B, Hkv, g, Nkv, d).sum(axis=2)
    dV = dV.reshape(B, Hkv, g, Nkv, d).sum(axis=2)
    return dQ, dK, dV
