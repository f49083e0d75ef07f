#!/usr/bin/env python3
"""tool_replay.py - the Python tool's trainer on bk-bake's own trajectories.

usage: tool_replay.py CONFIG TRAJ_JSONL INIT_ADAPTER OUT [--hf5-tokenizer]

The tool's PromptBakingTrainer (HF Trainer: AdamW, schedule, gradient clipping, its
per-sample KL over the response positions) trains on the (prompt, response) records of
TRAJ_JSONL (bk-dump of the bk-gen stream a bk-bake pipe consumed, one JSON object a line
with "user", "response" and "batch"), in that order, per_device_train_batch_size records a
step (bk-step's batches), one epoch, from the LoRA weights of INIT_ADAPTER (a PEFT
safetensors file: bk-step's checkpoint after a step at learning rate 0).  Everything else
(model, system prompt, LoRA shape, optimizer fields) comes from the tool's own parsing of
CONFIG; the model in float32, as bakery computes on the CPU.  Prints "step N loss L lr R grad_norm G" lines and saves OUT/final_model.

By default the tokenizer keeps tokenizer.json's pre-tokenizer, as bakery does, so that
only the training is compared; --hf5-tokenizer leaves transformers 5's own (for
tokenizer_class GPT2Tokenizer: ByteLevel alone; man bk-bake, Transformers 5.3).
Run by bench/tool_replay.sh; needs the tool's venv (BAKE_TOOL_VENV)."""
import json
import sys

import torch
from peft import LoraConfig as PeftLoraConfig, get_peft_model, set_peft_model_state_dict
from safetensors.torch import load_file
from tokenizers import Tokenizer
from torch.utils.data import SequentialSampler
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

from bakery.config import BakeryConfig, DataConfig, LoraConfig
from bakery.data import build_system_prompt, create_dataset, prompt_baking_collator
from bakery.trainer import PromptBakingTrainer


class InOrder(PromptBakingTrainer):
    """The records in file order: bk-step's batches, not HF's shuffle."""

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    if len(args) != 4:
        sys.exit(__doc__.split("\n\n")[1])
    config, traj, init, out = args
    bc, dc, lc = HfArgumentParser((BakeryConfig, DataConfig, LoraConfig)).parse_yaml_file(
        config, allow_extra_keys=True)
    bc.system_prompt = build_system_prompt(bc, dc, None)
    recs = [json.loads(line) for line in open(traj)]
    per_batch = {}
    for r in recs:
        per_batch[r["batch"]] = per_batch.get(r["batch"], 0) + 1
    sizes = set(per_batch.values())
    if len(sizes) != 1:
        sys.exit("tool_replay: %s: batches of %s records; the replay needs one size" % (traj, sorted(sizes)))
    bc.per_device_train_batch_size = sizes.pop()
    bc.num_train_epochs = 1
    bc.gradient_accumulation_steps = 1
    bc.logging_steps = 1
    bc.output_dir = out
    tok = AutoTokenizer.from_pretrained(dc.model_name_or_path)
    if "--hf5-tokenizer" not in sys.argv:
        tok.backend_tokenizer.pre_tokenizer = Tokenizer.from_file(
            dc.model_name_or_path + "/tokenizer.json").pre_tokenizer
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    base = AutoModelForCausalLM.from_pretrained(dc.model_name_or_path, dtype=torch.float32)
    model = get_peft_model(base, PeftLoraConfig(
        r=lc.r, lora_alpha=lc.lora_alpha, target_modules=lc.target_modules,
        lora_dropout=lc.lora_dropout, bias=lc.bias, task_type="CAUSAL_LM"))
    res = set_peft_model_state_dict(model, load_file(init))
    if res.unexpected_keys:
        sys.exit("tool_replay: %s: tensors PEFT does not know: %s" % (init, res.unexpected_keys[:3]))
    trainer = InOrder(model=model, args=bc,
                      train_dataset=create_dataset([r["user"] for r in recs], [r["response"] for r in recs]),
                      processing_class=tok, data_collator=prompt_baking_collator)
    trainer.train()
    for h in trainer.state.log_history:
        if "loss" in h:
            print("step %d loss %.9g lr %.9g grad_norm %.9g" % (h["step"], h["loss"], h["learning_rate"], h["grad_norm"]))
    model.save_pretrained(out + "/final_model")


if __name__ == "__main__":
    main()
