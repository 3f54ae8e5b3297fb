#!/usr/bin/env python3
"""PyTorch's side of BenchmarkLinearFP8 (internal/runtime/fp8_bench_test.go), on the same GPU in the
same run: y [M, N] bf16 = x [M, K] bf16 · wᵀ for the transformer's two big Linear shapes, as
torch.nn.functional.linear in bf16 and as torch._scaled_mm (e4m3 × e4m3, bf16 out) with a per-tensor
activation scale and with per-token × per-channel scales (rowwise, what FramePack fp8 forks and
torchao call "rowwise"), the activation quantization included in the timed region, as ours is.
Prints one JSON object per line: shape, mode, ms (median of 20 after 3 warm-ups)."""
import json
import sys

import torch

E4M3_MAX = 448.0


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    torch.manual_seed(0)
    dev = "cuda"
    for M, K, N in [(17226, 3072, 3072), (17226, 3072, 12288)]:
        x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        sw = (w.float().abs().amax(dim=1, keepdim=True) / E4M3_MAX).clamp(min=1e-8)  # [N, 1]
        wq = (w.float() / sw).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        swt = sw.amax().reshape(())
        wqt = (w.float() / swt).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)

        def bf16():
            return torch.nn.functional.linear(x, w)

        def tensor():
            sa = (x.abs().amax().float() / E4M3_MAX).clamp(min=1e-8)
            xq = (x.float() / sa).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            return torch._scaled_mm(xq, wqt.t(), scale_a=sa, scale_b=swt, out_dtype=torch.bfloat16)

        def token():
            sa = (x.abs().amax(dim=1, keepdim=True).float() / E4M3_MAX).clamp(min=1e-8)  # [M, 1]
            xq = (x.float() / sa).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
            return torch._scaled_mm(xq, wq.t(), scale_a=sa, scale_b=sw.t().contiguous(), out_dtype=torch.bfloat16)

        for name, fn in [("bf16", bf16), ("fp8-tensor", tensor), ("fp8-token", token)]:
            try:
                ms = timed(fn)
                print(json.dumps({"shape": f"{M}x{K}x{N}", "mode": name, "ms": round(ms, 4)}), flush=True)
            except Exception as e:  # a torch without rowwise scaled_mm on this GPU
                print(json.dumps({"shape": f"{M}x{K}x{N}", "mode": name, "error": str(e)[:200]}), flush=True)
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
