"""torch.matmul in bf16 on llama-3.2-1b's weight shapes, the yardstick for llm.cu's GEMM (test.c's "GEMM tile
shapes" table, LLM_GPU_BENCH=1): A [M][K] times W [N][K] transposed, bf16 in and out (cuBLAS through PyTorch),
fresh random inputs (one set, as test.c times ours: small weights stay in L2), timed with CUDA events
after a warm-up: products issued back to back, the median of five trials' means.

Usage: python3 tools/torch_matmul.py   (on a machine with a GPU and PyTorch: the device machine has both)
"""
import torch

SHAPES = [("qkv", 3072, 2048), ("o", 2048, 2048), ("gate/up", 16384, 2048), ("down", 2048, 8192),
          ("logits", 128256, 2048)]
MS = [64, 128, 256, 512, 2048, 8192]


def time_matmul(M, N, K, reps=20, trials=5, sets=1):
    """Median over trials of the mean time of reps products issued back to back (the GPU's time, not the
    host's: one product alone between two events would time PyTorch's launch path too)"""
    a = [torch.randn(M, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    w = [torch.randn(N, K, device="cuda", dtype=torch.bfloat16) for _ in range(sets)]
    for i in range(3):
        torch.matmul(a[i % sets], w[i % sets].t())
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(reps):
            torch.matmul(a[i % sets], w[i % sets].t())
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    times.sort()
    return times[len(times) // 2]


def main():
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name, N, K in SHAPES:
        for M in MS:
            if N > 100000 and M > 256:
                continue
            t = time_matmul(M, N, K, reps=10 if M >= 2048 else 50)
            print(f"torch-mm {name:<7} {N:6d}x{K:<5d} M {M:5d}: {t * 1e6:8.1f} us "
                  f"({2.0 * M * N * K / t / 1e12:.0f} TFLOP/s)")


if __name__ == "__main__":
    main()
