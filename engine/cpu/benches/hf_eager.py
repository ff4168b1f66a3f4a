"""HF transformers eager on the same checkpoint and the same measurement as
`cargo run --release -p dstwin-cpu --example bench -- DIR [BATCH...]`: B prompts of 128 tokens
in one forward, then 32 greedy decode steps with the KV cache, f32, on the CPU. JSON lines;
each rate per second of wall time (`*_tok_s`) and per second of the process's CPU time
(`*_cpu_tok_s`, `time.process_time`).
Usage: hf_eager.py DIR [BATCH...] (needs torch and transformers; not part of the test suite)."""

import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

PROMPT, DECODE = 128, 32


def main() -> None:
    path = sys.argv[1]
    batches = [int(b) for b in sys.argv[2:]] or [1, 4, 16]
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(
        path, torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    for b in batches:
        ids = torch.tensor(
            [[2 + ((p * 31 + i * 7) % 300) for p in range(PROMPT)] for i in range(b)]
        )
        with torch.no_grad():
            t, c = time.perf_counter(), time.process_time()
            out = model(input_ids=ids, use_cache=True)
            prefill_s = time.perf_counter() - t
            prefill_cpu_s = time.process_time() - c
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            t, c = time.perf_counter(), time.process_time()
            for _ in range(DECODE):
                out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            decode_s = time.perf_counter() - t
            decode_cpu_s = time.process_time() - c
        print(json.dumps({"engine": "transformers-eager", "batch": b,
                          "prefill_tok_s": round(b * PROMPT / prefill_s, 1),
                          "decode_tok_s": round(b * DECODE / decode_s, 1),
                          "prefill_cpu_tok_s": round(b * PROMPT / prefill_cpu_s, 1),
                          "decode_cpu_tok_s": round(b * DECODE / decode_cpu_s, 1)}))


if __name__ == "__main__":
    main()
