#!/usr/bin/env python3
"""PyTorch SDPA at the transformer's joint attention (18,083 tokens, 24 heads x 128, bf16): the
reference rate for BenchmarkAttentionDiT (internal/runtime) on the same GPU."""
import torch

L, H, D = 18083, 24, 128
q, k, v = (torch.randn(1, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
for _ in range(3):
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
times = []
for _ in range(10):
    start.record()
    torch.nn.functional.scaled_dot_product_attention(q, k, v)
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end) / 1e3)
times.sort()
t = times[len(times) // 2]
print(f"pytorch sdpa bf16 [1,{H},{L},{D}]: {t * 1e3:.2f} ms, {4 * L * L * D * H / t / 1e12:.1f} TFLOP/s "
      f"(x60 layers: {60 * t:.3f} s)")
