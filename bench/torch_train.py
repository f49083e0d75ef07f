"""torch_train.py - the same step as bench/bench_step.c written with
HF transformers + PEFT (teacher forward without grad, student forward and backward,
full-logits KL over the response rows, torch AdamW), on a random Llama of the same
shape.  --device cpu (default): fp32 on the CPU.  --device cuda: base weights in bf16
(LoRA weights fp32, as PEFT keeps them with autocast), and the peak of
torch.cuda.max_memory_allocated is printed.
usage: python3 bench/torch_train.py [--device cpu|cuda] H L NH NKV I V R SEQS LEN [STEPS]"""
import os, sys, time
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from peft import LoraConfig, get_peft_model

args = sys.argv[1:]
device = "cpu"
if args and args[0] == "--device":
    device, args = args[1], args[2:]
H, L, NH, NKV, I, V, R, S, LEN = map(int, args[:9])
steps = int(args[9]) if len(args) > 9 else 3
torch.manual_seed(0)
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
cfg = LlamaConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=NH,
                  num_key_value_heads=NKV, intermediate_size=I, vocab_size=V,
                  max_position_embeddings=max(LEN, 128), tie_word_embeddings=False)
base = LlamaForCausalLM(cfg)
base = base.to(torch.bfloat16) if device == "cuda" else base.float()
model = get_peft_model(base.to(device), LoraConfig(
    r=R, lora_alpha=2 * R, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj",
    "o_proj", "gate_proj", "up_proj", "down_proj"]))
if device == "cuda":  # trainable LoRA weights and their optimizer state in fp32
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4)
ids = torch.randint(0, V, (S, LEN), device=device)
resp = LEN // 2
best = 1e30
amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else torch.autocast("cpu", enabled=False)
if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
for _ in range(steps):
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with amp:
        with torch.no_grad(), model.disable_adapter():
            t = model(input_ids=ids).logits[:, LEN - resp - 1:LEN - 1].float()
        s = model(input_ids=ids).logits[:, LEN - resp - 1:LEN - 1].float()
    pt = torch.softmax(t, -1)
    kl = (pt * (torch.log_softmax(t, -1) - torch.log_softmax(s, -1))).sum(-1).mean(-1).mean()
    opt.zero_grad()
    kl.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    best = min(best, time.perf_counter() - t0)
peak = f", peak_bytes={torch.cuda.max_memory_allocated()}" if device == "cuda" else ""
print(f"torch {torch.__version__} + PEFT ({device}): {S * LEN / best:.0f} tokens/s "
      f"(best of {steps} steps, {best:.3f} s/step, loss {kl.item():.4f}{peak})")
