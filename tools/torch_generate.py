#!/usr/bin/env python3
"""tools/torch_generate.py - the yardstick for `llm bench --dummy NAME` on a GPU: Hugging Face transformers'
generate() on the same shape with random bf16 weights, one batch of B prompts of P random tokens, N new tokens
each (EOS ignored), greedy. Prints output tokens per second, measured after a short warm-up.

    python3 tools/torch_generate.py tinyllama-1.1b [--batch 256] [--input-len 512] [--output-len 256]

Needs torch and transformers (the device machine has both); no weights are downloaded."""
import argparse, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {  # the shapes of llm.h's dummy presets of the same names
    "tinyllama-1.1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                           num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                           rope_theta=10000.0, tie_word_embeddings=False),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                         rope_theta=500000.0, tie_word_embeddings=True),
}

ap = argparse.ArgumentParser()
ap.add_argument("shape", choices=sorted(SHAPES))
ap.add_argument("--batch", type=int, default=256)
ap.add_argument("--input-len", type=int, default=512)
ap.add_argument("--output-len", type=int, default=256)
a = ap.parse_args()

cfg = LlamaConfig(max_position_embeddings=4096, **SHAPES[a.shape])
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
ids = torch.randint(0, cfg.vocab_size, (a.batch, a.input_len), device="cuda")
mask = torch.ones_like(ids)

def generate(n):
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, pad_token_id=0, eos_token_id=None)

generate(4)  # warm-up: kernels loaded, allocator grown
torch.cuda.synchronize()
t0 = time.perf_counter()
out = generate(a.output_len)
torch.cuda.synchronize()
dt = time.perf_counter() - t0
new = (out.shape[1] - a.input_len) * a.batch
print(f"torch generate {a.shape}: batch {a.batch} x ({a.input_len} in, {a.output_len} out): {dt:.2f} s, "
      f"output {new / dt:.0f} tok/s (prefill included), {torch.cuda.get_device_name()}, "
      f"torch {torch.__version__}")
