"""torch_train.py - the same step as bench_train.c written with HF transformers + PEFT
(teacher forward without grad, student forward and backward, full-logits KL over the
response rows, torch AdamW), on a random Llama of the same shape.
usage: python3 bench/torch_train.py H L NH NKV I V R SEQS LEN [STEPS]"""
import sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

H, L, NH, NKV, I, V, R, S, LEN = map(int, sys.argv[1:10])
steps = int(sys.argv[10]) if len(sys.argv) > 10 else 3
torch.manual_seed(0)
torch.set_num_threads(int(__import__("os").environ.get("BENCH_THREADS", "2")))
cfg = LlamaConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                  num_key_value_heads=NKV, intermediate_size=I, vocab_size=V,
                  max_position_embeddings=max(LEN, 128), tie_word_embeddings=False)
model = get_peft_model(LlamaForCausalLM(cfg).float(), LoraConfig(
    r=R, lora_alpha=2 * R, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj",
    "o_proj", "gate_proj", "up_proj", "down_proj"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
ids = torch.randint(0, V, (S, LEN))
resp = LEN // 2
best = 1e30
for _ in range(steps):
    t0 = time.perf_counter()
    with torch.no_grad(), model.disable_adapter():
        t = model(input_ids=ids).logits[:, LEN - resp - 1:LEN - 1]
    s = model(input_ids=ids).logits[:, LEN - resp - 1:LEN - 1]
    pt = torch.softmax(t, -1)
    kl = (pt * (torch.log_softmax(t, -1) - torch.log_softmax(s, -1))).sum(-1).mean(-1).mean()
    opt.zero_grad()
    kl.backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    opt.step()
    best = min(best, time.perf_counter() - t0)
print(f"torch {torch.__version__} + PEFT: {S * LEN / best:.0f} tokens/s "
      f"(best of {steps} steps, {best:.3f} s/step, loss {kl.item():.4f})")
