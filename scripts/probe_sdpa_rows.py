"""Do attention rows depend on how many rows a call holds? Compares each row of an M-row scaled_dot_product_attention
(a causal tail, as a verify pass has) with the same row computed alone (as plain decoding does), for M = 2..32.

    python scripts/probe_sdpa_rows.py                      # MLX's bundled BLAS
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 python scripts/probe_sdpa_rows.py
"""

import mlx.core as mx

mx.random.seed(0)
B, H, Hkv, S, D = 1, 12, 4, 300, 64
k = mx.random.normal((B, Hkv, S, D))
v = mx.random.normal((B, Hkv, S, D))
for M in (2, 4, 8, 16, 32):
    q = mx.random.normal((B, H, M, D))
    # row i attends to keys 0..S-M+i (causal tail)
    mask = mx.arange(S)[None] <= (S - M + mx.arange(M))[:, None]
    full = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.125, mask=mask)
    diffs = 0
    for i in range(M):
        one = mx.fast.scaled_dot_product_attention(
            q[:, :, i : i + 1], k[:, :, : S - M + i + 1], v[:, :, : S - M + i + 1], scale=0.125
        )
        diffs += int((one != full[:, :, i : i + 1]).sum().item())
    print(M, "differing elements:", diffs)
