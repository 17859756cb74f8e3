"""Whether the float code path changes a training run: 40 AdamW steps of a Llama of
config.yaml's tiny size on fixed random tokens, printing the last loss and a hash of the
weights. Run it under different ATEN_CPU_CAPABILITY / MKL_CBWR settings and compare
(docs/experiment-design.md, "The start moves with the CPU"). Argument: torch threads (1).

`import reasonrl` asks for the AVX2 paths unless the variables are set already.
"""

import hashlib
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import reasonrl  # noqa: F401

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
config = LlamaConfig(
    vocab_size=2048,
    hidden_size=192,
    intermediate_size=512,
    num_hidden_layers=4,
    num_attention_heads=6,
    num_key_value_heads=6,
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
torch.manual_seed(0)
model = LlamaForCausalLM(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
tokens = torch.Generator().manual_seed(1)
started = time.time()
for _ in range(40):
    ids = torch.randint(0, 2048, (16, 96), generator=tokens)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
print(
    f"kernels {torch.backends.cpu.get_cpu_capability()}, last loss {loss.item()!r}, "
    f"weights {hashlib.sha256(weights).hexdigest()[:16]}, {time.time() - started:.1f} s"
)
