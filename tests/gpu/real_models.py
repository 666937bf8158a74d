#!/usr/bin/env python3
"""Builds the real-model cases of the GPU suite (tests/gpu/real_models.sh).

  real_models.py WORK [--quick]

Hugging Face causal LMs built from their configs with random weights (no
download), saved the ordinary way (save_pretrained), compiled with
examples/wb_compile.py:

* gpt2 (tied embeddings: save_pretrained drops lm_head.weight), fp32, one
  model.safetensors; exported bare and inside a wrapper (FQNs "model.<name>");
* llama (non-persistent rotary buffers inv_freq/original_inv_freq), bf16,
  sharded (model.safetensors.index.json), bare and wrapped;
* lora_a / lora_b: two variants of the gpt2 base that differ only in small
  LoRA A/B matrices applied in the forward to the logits projection; each
  variant's matrices are a checkpoint of their own, leased beside the base;
* gpt2 compiled for the CPU, for the broker's host backend.

Writes WORK/cases.json: one entry per case with the checkpoints to load, the
package, the input and eager reference files, worker options, tolerance and
facts for the report (checkpoint tensor counts, tied bytes).
"""
import argparse
import json
import os
import sys
import time

import torch
from safetensors.torch import save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples"))
import wb_compile  # noqa: E402

SEQ = 16


class bare:
    """The HF model itself, its forward reduced (for the duration) to
    input_ids -> logits: the FQNs stay those of the checkpoint."""

    def __init__(self, model):
        self.model = model

    def __enter__(self):
        m, orig = self.model, type(self.model).forward
        m.forward = lambda input_ids: orig(m, input_ids=input_ids, use_cache=False).logits
        return m

    def __exit__(self, *exc):
        del self.model.forward


class LoraVariant(torch.nn.Module):
    """logits = base(ids) + (h @ A^T) @ B^T with h the final hidden states:
    a per-variant low-rank update of the tied output projection."""

    def __init__(self, base, rank, seed):
        super().__init__()
        self.base = base
        d, v = base.config.n_embd, base.config.vocab_size
        g = torch.Generator().manual_seed(seed)
        self.lora_A = torch.nn.Parameter(torch.randn(rank, d, generator=g) * 0.05)
        self.lora_B = torch.nn.Parameter(torch.randn(v, rank, generator=g) * 0.05)

    def forward(self, input_ids):
        h = self.base.transformer(input_ids=input_ids, use_cache=False).last_hidden_state
        return self.base.lm_head(h) + (h @ self.lora_A.t()) @ self.lora_B.t()


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    only = set(filter(None, a.only.split(",")))
    want = lambda name: not only or name in only  # noqa: E731
    os.makedirs(a.work, exist_ok=True)
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    dev = "cuda"
    cases, facts = [], {}

    def case(name, module, ckpts, dtype, tol, device, wrapped, extra_opts=(), example=None):
        if not want(name):
            return
        pt2 = os.path.join(a.work, f"{name}.pt2")
        vocab = 1000
        ids = example if example is not None else torch.randint(0, vocab, (1, SEQ),
                                                                device=device)
        with torch.no_grad():
            ref = module(ids)
            ref = ref[0] if isinstance(ref, (tuple, list)) else ref
            t0 = time.time()
            info = wb_compile.compile_package(
                module, (ids,), pt2,
                checkpoint=ckpts[0][1] if len(ckpts) == 1 else None,
                strip_prefix="model." if wrapped else None)
        save_file({"input0": ids.cpu().contiguous()}, os.path.join(a.work, f"{name}_in.safetensors"))
        save_file({"output0": ref.float().cpu().contiguous()},
                  os.path.join(a.work, f"{name}_ref.safetensors"))
        cases.append({"name": name, "pt2": pt2, "checkpoints": ckpts, "dtype": dtype,
                      "tolerance": tol, "device": device, "wrapped": wrapped,
                      "opts": list(extra_opts), "compile": info,
                      "input": os.path.join(a.work, f"{name}_in.safetensors"),
                      "ref": os.path.join(a.work, f"{name}_ref.safetensors"),
                      "seconds": round(time.time() - t0, 1)})
        print(f"compiled {name}: {json.dumps(info)}", flush=True)

    # ---- gpt2: tied embeddings, fp32, one file ------------------------------
    gcfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64,
                      tie_word_embeddings=True)
    gpt2 = GPT2LMHeadModel(gcfg).eval()
    gdir = os.path.join(a.work, "gpt2")
    gpt2.save_pretrained(gdir)
    names = wb_compile.checkpoint_names(gdir)
    sd = gpt2.state_dict()
    facts["gpt2"] = {"checkpoint_tensors": len(names), "state_dict_tensors": len(sd),
                     "tied_bytes": sd["transformer.wte.weight"].numel() * 4,
                     "lm_head_in_checkpoint": "lm_head.weight" in names}
    gpt2 = gpt2.to(dev)
    with bare(gpt2) as m:
        case("gpt2_fp32", m, [["gpt2", gdir]], "F32", 1e-4, dev, False)
    case("gpt2_fp32_wrapped", wb_compile.LogitsOnly(gpt2), [["gpt2", gdir]], "F32", 1e-4, dev,
         True)

    # ---- llama: rotary buffers, bf16, sharded -------------------------------
    lcfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                       max_position_embeddings=64, tie_word_embeddings=False)
    llama = LlamaForCausalLM(lcfg).to(torch.bfloat16).eval()
    ldir = os.path.join(a.work, "llama")
    llama.save_pretrained(ldir, max_shard_size="200KB")
    lnames = wb_compile.checkpoint_names(ldir)
    facts["llama"] = {"checkpoint_tensors": len(lnames),
                      "shards": len([f for f in os.listdir(ldir) if f.endswith(".safetensors")]),
                      "buffers_not_in_checkpoint": sorted(
                          n for n, _ in llama.named_buffers() if n not in lnames)}
    llama = llama.to(dev)
    with bare(llama) as m:
        case("llama_bf16", m, [["llama", ldir]], "BF16", 2e-2, dev, False)
    case("llama_bf16_wrapped", wb_compile.LogitsOnly(llama), [["llama", ldir]], "BF16", 2e-2,
         dev, True)

    # ---- llama in fp16, sharded ---------------------------------------------
    if want("llama_fp16"):
        l16 = LlamaForCausalLM(lcfg).to(torch.float16).eval()
        l16dir = os.path.join(a.work, "llama_fp16")
        l16.save_pretrained(l16dir, max_shard_size="200KB")
        with bare(l16.to(dev)) as m:
            case("llama_fp16", m, [["llama_fp16", l16dir]], "F16", 1e-2, dev, False)

    # ---- two LoRA variants of the gpt2 base ---------------------------------
    for v, seed in (("a", 1), ("b", 2)):
        if not want(f"lora_{v}"):
            continue
        m = LoraVariant(gpt2, 4, seed).to(dev).eval()
        hp = os.path.join(a.work, f"lora_{v}.safetensors")
        save_file({"lora_A": m.lora_A.detach().cpu().contiguous(),
                   "lora_B": m.lora_B.detach().cpu().contiguous()}, hp)
        # FQNs base.transformer.* / base.lm_head.weight / lora_A / lora_B:
        # strip "base." maps the base onto the gpt2 checkpoint.
        pt2 = os.path.join(a.work, f"lora_{v}.pt2")
        ids = torch.randint(0, 1000, (1, SEQ), device=dev)
        with torch.no_grad():
            ref = m(ids)
            ckpt = wb_compile.checkpoint_names(gdir) | {"lora_A", "lora_B"}
            ep = torch.export.export(m, (ids,), strict=False)
            torch._inductor.aoti_compile_and_package(
                ep, package_path=pt2,
                inductor_configs={"aot_inductor.package_constants_in_so": False})
            leased, aliases, extra = wb_compile.plan(m, ckpt, "base.", None, ep)
            wb_compile.write_constants(pt2, aliases, extra, "base.", None)
        save_file({"input0": ids.cpu()}, os.path.join(a.work, f"lora_{v}_in.safetensors"))
        save_file({"output0": ref.float().cpu()}, os.path.join(a.work, f"lora_{v}_ref.safetensors"))
        cases.append({"name": f"lora_{v}", "pt2": pt2,
                      "checkpoints": [["gpt2", gdir], [f"lora_{v}", hp]], "dtype": "F32",
                      "tolerance": 1e-4, "device": dev, "wrapped": True, "opts": [],
                      "compile": {"aliases": aliases, "extra": sorted(extra)},
                      "input": os.path.join(a.work, f"lora_{v}_in.safetensors"),
                      "ref": os.path.join(a.work, f"lora_{v}_ref.safetensors")})
        print(f"compiled lora_{v}: aliases={aliases} extra={sorted(extra)}", flush=True)
        facts[f"lora_{v}_bytes"] = os.path.getsize(hp)

    # ---- the CPU: gpt2 for the host backend ---------------------------------
    if not a.no_cpu and want("gpt2_fp32_cpu"):
        gcpu = GPT2LMHeadModel(gcfg).eval()
        gcpu.load_state_dict(gpt2.state_dict())
        with bare(gcpu) as m:
            case("gpt2_fp32_cpu", m, [["gpt2", gdir]], "F32", 1e-4, "cpu", False)

    with open(os.path.join(a.work, "cases.json"), "w") as f:
        json.dump({"cases": cases, "facts": facts, "torch": torch.__version__}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
