#!/usr/bin/env python3
"""Builds the real-model cases of the GPU suite (tests/gpu/real_models.sh).

  real_models.py WORK [--only NAMES] [--no-cpu] [--deadline-s S]

Hugging Face causal LMs built from their configs with random weights (no
download), saved the ordinary way (save_pretrained), compiled with
weightbroker.compile (python/weightbroker/compile):

* gpt2 (tied embeddings: save_pretrained drops lm_head.weight), fp32, one
  model.safetensors; exported bare and inside a wrapper (FQNs "model.<name>");
* llama (non-persistent rotary buffers inv_freq/original_inv_freq), bf16,
  sharded (model.safetensors.index.json), bare and wrapped;
* lora_a / lora_b: two variants of the gpt2 base that differ only in small
  LoRA A/B matrices applied in the forward to the logits projection; each
  variant's matrices are a checkpoint of their own, leased beside the base;
* gpt2 compiled for the CPU, for the broker's host backend.

Then three models that a checkpoint alone cannot serve, each compiled twice:
with torch's own API only (torch.export.export, then
torch._inductor.aoti_compile_and_package with package_constants_in_so=False;
case <name>_torch) and with weightbroker.compile (case <name>):

* llama_tied: a Llama with tied embeddings (fp32, sharded), exported inside
  a wrapper; its rotary inv_freq is in no checkpoint. Compiled the second
  time by the command line, python3 -m weightbroker.compile hf.
* bert_mlm: BertForMaskedLM (decoder weight and bias tied to the word
  embeddings and the head's bias; int64 position_ids and token_type_ids in
  no checkpoint), exported bare. Compiled the second time by the command
  line with --dynamic-batch --dynamic-seq, and served at another batch and
  length than its example.
* resnet18: ResNet-18 from timm (torchvision where timm is missing), random
  weights and BatchNorm statistics, saved from its state dict (the running
  statistics are in it). Compiled the second time by compile_package(...,
  dynamic_batch=True), and served at another batch than its example.

The worker of a torch-API case gets what a user reads off the model
(--strip-prefix for a wrapper, --alias for each tie). Where the compiled
graph reads buffers that no checkpoint holds, the case expects the worker to
refuse to create its container, before any run, with WB_ENOTFOUND naming
each of them ("expect": "refused", "expect_named"); where the checkpoint
holds every constant, it expects the model served. Every case compiled by
weightbroker.compile expects the model served and its outputs equal to eager
PyTorch's.

Writes WORK/cases.json after every case (with "complete": true once all
were tried): one entry per case with the checkpoints to load, the package,
the input and eager reference files, worker options, tolerance,
expectation; "failed" lists the cases whose build raised, "skipped" those
left out because --deadline-s (seconds from the start) had passed; "facts"
holds what the report says about the models.
"""
import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch
from safetensors.torch import save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "python"))
import weightbroker.compile as wbc  # noqa: E402

SEQ = 16
VOCAB = 1000
CAUSAL_LMS = ("gpt2_fp32", "gpt2_fp32_wrapped", "llama_bf16", "llama_bf16_wrapped", "llama_fp16",
              "lora_a", "lora_b")


class bare:
    """The HF model itself, its forward reduced (for the duration) to
    input_ids -> logits: the FQNs stay those of the checkpoint. use_cache
    None: not passed (a masked LM takes none)."""

    def __init__(self, model, use_cache=False):
        self.model = model
        self.kwargs = {} if use_cache is None else {"use_cache": use_cache}

    def __enter__(self):
        m, orig, kw = self.model, type(self.model).forward, self.kwargs
        m.forward = lambda input_ids: orig(m, input_ids=input_ids, **kw).logits
        return m

    def __exit__(self, *exc):
        del self.model.forward


class Logits(torch.nn.Module):
    """A user's own wrapper (not weightbroker.compile's LogitsOnly):
    input_ids -> logits, FQNs "model.<name>"."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


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


def mapped(name, strip):
    return name[len(strip):] if strip and name.startswith(strip) else name


def user_aliases(module, names, strip):
    """The --alias flags a user would give, read off the eager model: each
    parameter in no checkpoint that is the same tensor as one that is in it
    -> {checkpoint-side name: checkpoint name}."""
    groups = {}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(fqn)
    out = {}
    for fqns in groups.values():
        held = [f for f in fqns if mapped(f, strip) in names]
        for f in fqns:
            if held and mapped(f, strip) not in names:
                out[mapped(f, strip)] = mapped(held[0], strip)
    return out


def unbacked_buffers(ep, names, strip, aliases):
    """Checkpoint-side names of the buffers and tensor constants the exported
    graph reads that neither the checkpoint nor an alias gives: a library
    compiled with package_constants_in_so=False has no data for them."""
    sig = ep.graph_signature
    owners = dict(sig.inputs_to_buffers)
    owners.update(getattr(sig, "inputs_to_lifted_tensor_constants", {}) or {})
    out = set()
    for n in ep.graph.nodes:
        if n.op == "placeholder" and n.name in owners and n.users:
            m = mapped(owners[n.name], strip)
            if m not in names and m not in aliases:
                out.add(m)
    return sorted(out)


class Run:
    """The cases built so far, written to WORK/cases.json after each."""

    def __init__(self, work, only, deadline_s):
        self.work, self.only, self.t0 = work, only, time.time()
        self.deadline_s = deadline_s
        self.cases, self.facts, self.failed, self.skipped = [], {}, [], []

    def selected(self, *names):
        return not self.only or any(n in self.only for n in names)

    def attempt(self, name, build, *args):
        """build(*args) for case `name` when it is selected and the deadline
        has not passed (else it is listed as skipped); an exception is
        recorded as the case's failure and the other cases go on."""
        if not self.selected(name):
            return
        used = time.time() - self.t0
        if self.deadline_s and used > self.deadline_s:
            self.skipped.append(name)
            print(f"skipped {name}: {used:.0f} s of {self.deadline_s} s used", flush=True)
            self.save()
            return
        try:
            build(*args)
        except Exception as e:
            self.failed.append({"name": name, "error": f"{type(e).__name__}: {e}"[:2000],
                                "traceback": traceback.format_exc()[-4000:]})
            print(f"FAILED {name}: {e}", flush=True)
            traceback.print_exc()
            self.save()

    def family(self, names, build, *args):
        """build(*args), which builds the cases `names` of one model: a
        failure before a case was tried (making the model, saving its
        checkpoint) is recorded for each selected case not yet tried."""
        if not self.selected(*names):
            return
        try:
            build(*args)
        except Exception as e:
            tried = {c["name"] for c in self.cases} | {f["name"] for f in self.failed} | set(
                self.skipped)
            for name in names:
                if self.selected(name) and name not in tried:
                    self.failed.append({"name": name, "error": f"{type(e).__name__}: {e}"[:2000],
                                        "traceback": traceback.format_exc()[-4000:]})
            print(f"FAILED {', '.join(names)}: {e}", flush=True)
            traceback.print_exc()
            self.save()

    def left(self, floor=60):
        """Seconds before the deadline, at least `floor` (a subprocess's
        timeout)."""
        if not self.deadline_s:
            return 900
        return max(floor, self.deadline_s - (time.time() - self.t0))

    def path(self, name):
        return os.path.join(self.work, name)

    def add(self, name, pt2, ckpts, ids, ref, dtype, tol, device, wrapped, opts=(), info=None,
            seconds=None, compiled_by="wbc", expect="served", expect_named=()):
        save_file({"input0": ids.cpu().contiguous()}, self.path(f"{name}_in.safetensors"))
        save_file({"output0": ref.float().cpu().contiguous()},
                  self.path(f"{name}_ref.safetensors"))
        self.cases.append({"name": name, "pt2": pt2, "checkpoints": ckpts, "dtype": dtype,
                           "tolerance": tol, "device": device, "wrapped": wrapped,
                           "opts": list(opts), "compile": info or {},
                           "compiled_by": compiled_by, "expect": expect,
                           "expect_named": list(expect_named),
                           "input": self.path(f"{name}_in.safetensors"),
                           "ref": self.path(f"{name}_ref.safetensors"),
                           "seconds": seconds})
        print(f"compiled {name}: {json.dumps(info)}", flush=True)
        self.save()

    def save(self, complete=False):
        tmp = self.path("cases.json.tmp")
        with open(tmp, "w") as f:
            json.dump({"cases": self.cases, "facts": self.facts, "failed": self.failed,
                       "skipped": self.skipped, "torch": torch.__version__,
                       "only": sorted(self.only), "complete": complete,
                       "seconds": round(time.time() - self.t0, 1)}, f, indent=1)
        os.replace(tmp, self.path("cases.json"))


def wbc_case(run, name, module, ckpts, dtype, tol, device, wrapped, example=None):
    """A case compiled in this process with compile_package."""
    pt2 = run.path(f"{name}.pt2")
    ids = example if example is not None else torch.randint(0, VOCAB, (1, SEQ), device=device)
    with torch.no_grad():
        ref = module(ids)
        ref = ref[0] if isinstance(ref, (tuple, list)) else ref
        t0 = time.time()
        info = wbc.compile_package(module, (ids,), pt2,
                                   checkpoint=ckpts[0][1] if len(ckpts) == 1 else None,
                                   strip_prefix="model." if wrapped else None)
    run.add(name, pt2, ckpts, ids, ref, dtype, tol, device, wrapped, (), info,
            round(time.time() - t0, 1))


def wbc_cli(run, args):
    """python3 -m weightbroker.compile ARGS in a process of its own, as a
    user runs it (bounded by the deadline); returns the JSON it printed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "weightbroker.compile"] + args
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=run.left(), env=env)
    sys.stderr.write(r.stderr[-4000:])
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited with {r.returncode}: {r.stderr[-1500:]}")
    # The JSON document is the last thing printed (indent 1: its opening
    # brace alone on a line).
    start = r.stdout.rfind("\n{\n")
    return json.loads(r.stdout[start + 1:] if start >= 0 else r.stdout)


def causal_lms(run, dev, no_cpu):
    """The causal LMs compiled with weightbroker.compile (see the top)."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    facts = run.facts

    def case(name, module, *args):
        run.attempt(name, wbc_case, run, name, module, *args)

    # gpt2: tied embeddings, fp32, one file.
    gcfg = GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=VOCAB, n_positions=64,
                      tie_word_embeddings=True)
    gpt2 = GPT2LMHeadModel(gcfg).eval()
    gdir = run.path("gpt2")
    gpt2.save_pretrained(gdir)
    names = wbc.checkpoint_names(gdir)
    sd = gpt2.state_dict()
    facts["gpt2"] = {"checkpoint_tensors": len(names), "state_dict_tensors": len(sd),
                     "tied_bytes": sd["transformer.wte.weight"].numel() * 4,
                     "lm_head_in_checkpoint": "lm_head.weight" in names}
    gpt2 = gpt2.to(dev)
    with bare(gpt2) as m:
        case("gpt2_fp32", m, [["gpt2", gdir]], "F32", 1e-4, dev, False)
    case("gpt2_fp32_wrapped", wbc.LogitsOnly(gpt2), [["gpt2", gdir]], "F32", 1e-4, dev, True)

    # llama: rotary buffers, bf16, sharded.
    lcfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                       max_position_embeddings=64, tie_word_embeddings=False)
    llama = LlamaForCausalLM(lcfg).to(torch.bfloat16).eval()
    ldir = run.path("llama")
    llama.save_pretrained(ldir, max_shard_size="200KB")
    lnames = wbc.checkpoint_names(ldir)
    facts["llama"] = {"checkpoint_tensors": len(lnames),
                      "shards": len([f for f in os.listdir(ldir) if f.endswith(".safetensors")]),
                      "buffers_not_in_checkpoint": sorted(
                          n for n, _ in llama.named_buffers() if n not in lnames)}
    llama = llama.to(dev)
    with bare(llama) as m:
        case("llama_bf16", m, [["llama", ldir]], "BF16", 2e-2, dev, False)
    case("llama_bf16_wrapped", wbc.LogitsOnly(llama), [["llama", ldir]], "BF16", 2e-2, dev,
         True)

    # llama in fp16, sharded (its own checkpoint).
    def fp16():
        l16 = LlamaForCausalLM(lcfg).to(torch.float16).eval()
        l16dir = run.path("llama_fp16")
        l16.save_pretrained(l16dir, max_shard_size="200KB")
        with bare(l16.to(dev)) as m:
            wbc_case(run, "llama_fp16", m, [["llama_fp16", l16dir]], "F16", 1e-2, dev, False)
    run.attempt("llama_fp16", fp16)

    # Two LoRA variants of the gpt2 base.
    for v, seed in (("a", 1), ("b", 2)):
        run.attempt(f"lora_{v}", lora, run, gpt2, gdir, v, seed, dev)

    # The CPU: gpt2 for the host backend.
    if not no_cpu:
        gcpu = GPT2LMHeadModel(gcfg).eval()
        gcpu.load_state_dict(gpt2.state_dict())
        with bare(gcpu) as m:
            case("gpt2_fp32_cpu", m, [["gpt2", gdir]], "F32", 1e-4, "cpu", False)


def lora(run, gpt2, gdir, v, seed, dev):
    m = LoraVariant(gpt2, 4, seed).to(dev).eval()
    hp = run.path(f"lora_{v}.safetensors")
    save_file({"lora_A": m.lora_A.detach().cpu().contiguous(),
               "lora_B": m.lora_B.detach().cpu().contiguous()}, hp)
    # FQNs base.transformer.* / base.lm_head.weight / lora_A / lora_B:
    # strip "base." maps the base onto the gpt2 checkpoint.
    pt2 = run.path(f"lora_{v}.pt2")
    ids = torch.randint(0, VOCAB, (1, SEQ), device=dev)
    t0 = time.time()
    with torch.no_grad():
        ref = m(ids)
        ckpt = wbc.checkpoint_names(gdir) | {"lora_A", "lora_B"}
        ep = torch.export.export(m, (ids,), strict=False)
        torch._inductor.aoti_compile_and_package(
            ep, package_path=pt2,
            inductor_configs={"aot_inductor.package_constants_in_so": False})
        leased, aliases, extra = wbc.plan(m, ckpt, "base.", None, ep)
        wbc.write_constants(pt2, aliases, extra, "base.", None)
    run.facts[f"lora_{v}_bytes"] = os.path.getsize(hp)
    run.add(f"lora_{v}", pt2, [["gpt2", gdir], [f"lora_{v}", hp]], ids, ref, "F32", 1e-4, dev,
            True, info={"aliases": aliases, "extra": sorted(extra)},
            seconds=round(time.time() - t0, 1))


def torch_api_case(run, name, module, x, ckpts, names, strip, dtype, tol, dev, in_so=False):
    """A case compiled with torch's own API; its worker is given the prefix
    rule and the ties; it expects a refusal naming the buffers that have no
    data, or, where there are none, the model served. With in_so the
    library embeds its constants (package_constants_in_so=True): the
    buffers no checkpoint holds keep the library's own data, the rest is
    leased, and the model must serve (no inactive-buffer swap frees the
    copy those buffers point into)."""
    t0 = time.time()
    pt2 = run.path(f"{name}.pt2")
    aliases = user_aliases(module, names, strip)
    with torch.no_grad():
        ref = module(x)
        # torch's own route: export, then AOTInductor with the constants
        # outside the library. The program is read before the compile,
        # which may rewrite it.
        ep = torch.export.export(module, (x,), strict=False)
        missing = unbacked_buffers(ep, names, strip, aliases)
        torch._inductor.aoti_compile_and_package(
            ep, package_path=pt2,
            inductor_configs={"aot_inductor.package_constants_in_so": in_so})
    opts = ([f"--strip-prefix {strip}"] if strip else []) + [
        f"--alias {k}={v}" for k, v in sorted(aliases.items())]
    info = {"api": "torch._inductor.aoti_compile_and_package", "aliases": aliases,
            "unbacked_buffers": missing, "package_constants_in_so": in_so}
    refused = bool(missing) and not in_so
    run.add(name, pt2, ckpts, x, ref, dtype, tol, dev, bool(strip), opts, info,
            round(time.time() - t0, 1), compiled_by="torch",
            expect="refused" if refused else "served", expect_named=missing if refused else [])


def llama_tied(run, dev):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                      max_position_embeddings=64, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    d = run.path("llama_tied")
    model.save_pretrained(d, max_shard_size="200KB")
    names = wbc.checkpoint_names(d)
    run.facts["llama_tied"] = {
        "checkpoint_tensors": len(names), "lm_head_in_checkpoint": "lm_head.weight" in names,
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "shards": len([f for f in os.listdir(d) if f.endswith(".safetensors")]),
        "buffers_not_in_checkpoint": sorted(n for n, _ in model.named_buffers()
                                            if n not in names)}
    model = model.to(dev)
    ids = torch.randint(0, VOCAB, (1, SEQ), device=dev)
    ckpts = [["llama_tied", d]]
    run.attempt("llama_tied_torch", torch_api_case, run, "llama_tied_torch", Logits(model), ids,
                ckpts, names, "model.", "F32", 1e-4, dev)
    # The same with its constants in the library: the rotary buffers keep
    # the library's copy, everything else is leased.
    run.attempt("llama_tied_embedded_torch", torch_api_case, run, "llama_tied_embedded_torch",
                Logits(model), ids, ckpts, names, "model.", "F32", 1e-4, dev, True)

    def with_wbc():
        t0 = time.time()
        pt2 = run.path("llama_tied.pt2")
        info = wbc_cli(run, ["hf", d, pt2, "--device", dev, "--seq-len", str(SEQ)])
        with torch.no_grad():
            ref = Logits(model)(ids)
        run.add("llama_tied", pt2, ckpts, ids, ref, "F32", 1e-4, dev, True, (), info,
                round(time.time() - t0, 1))
    run.attempt("llama_tied", with_wbc)


def bert_mlm(run, dev):
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=256, max_position_embeddings=64)
    model = BertForMaskedLM(cfg).eval()
    d = run.path("bert_mlm")
    model.save_pretrained(d)
    names = wbc.checkpoint_names(d)
    run.facts["bert_mlm"] = {
        "checkpoint_tensors": len(names),
        "buffers": {n: str(b.dtype) for n, b in model.named_buffers()},
        "buffers_not_in_checkpoint": sorted(n for n, _ in model.named_buffers()
                                            if n not in names),
        "tied_not_in_checkpoint": sorted(user_aliases(model, names, None))}
    model = model.to(dev)
    ckpts = [["bert_mlm", d]]

    def torch_api():
        ids = torch.randint(0, VOCAB, (1, SEQ), device=dev)
        with bare(model, use_cache=None) as m:
            torch_api_case(run, "bert_mlm_torch", m, ids, ckpts, names, None, "F32", 1e-4, dev)
    run.attempt("bert_mlm_torch", torch_api)

    def with_wbc():
        # Compiled for any batch and length on a (2, 16) example, served at
        # (3, 24).
        t0 = time.time()
        pt2 = run.path("bert_mlm.pt2")
        info = wbc_cli(run, ["hf", d, pt2, "--device", dev, "--seq-len", str(SEQ),
                                "--dynamic-batch", "--dynamic-seq"])
        ids = torch.randint(0, VOCAB, (3, 24), device=dev)
        with torch.no_grad():
            ref = model(input_ids=ids).logits
        run.add("bert_mlm", pt2, ckpts, ids, ref, "F32", 1e-4, dev, True, (), info,
                round(time.time() - t0, 1))
    run.attempt("bert_mlm", with_wbc)


def vision_model():
    """ResNet-18 with random weights, from timm or else torchvision, and
    where it came from."""
    try:
        import timm
        return timm.create_model("resnet18", pretrained=False, num_classes=100), \
            "timm " + timm.__version__
    except ImportError:
        import torchvision
        return torchvision.models.resnet18(weights=None, num_classes=100), \
            "torchvision " + torchvision.__version__


def resnet18(run, dev):
    net, source = vision_model()
    # Random BatchNorm statistics and affine weights, so that a statistic
    # bound to the wrong tensor changes the outputs.
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.weight.shape, generator=g) * 0.5 + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.1)
    net = net.eval()
    d = run.path("resnet18")
    os.makedirs(d, exist_ok=True)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              os.path.join(d, "model.safetensors"))
    names = wbc.checkpoint_names(d)
    bn_buffers = sorted(n for n, _ in net.named_buffers())
    run.facts["resnet18"] = {"source": source, "checkpoint_tensors": len(names),
                             "buffers": len(bn_buffers),
                             "buffers_not_in_checkpoint": [n for n in bn_buffers
                                                           if n not in names]}
    net = net.to(dev)
    ckpts = [["resnet18", d]]
    # cuDNN may run the convolutions in TF32, eagerly and in the worker.
    tol = 1e-2
    run.attempt("resnet18_torch", torch_api_case, run, "resnet18_torch", net,
                torch.randn(2, 3, 64, 64, device=dev), ckpts, names, None, "F32", tol, dev)

    def with_wbc():
        # Compiled for any batch on a batch of 2, served with 3.
        t0 = time.time()
        pt2 = run.path("resnet18.pt2")
        x = torch.randn(3, 3, 64, 64, device=dev)
        with torch.no_grad():
            ref = net(x)
            info = wbc.compile_package(net, (torch.randn(2, 3, 64, 64, device=dev),), pt2,
                                       checkpoint=d, dynamic_batch=True)
        run.add("resnet18", pt2, ckpts, x, ref, "F32", tol, dev, False, (), info,
                round(time.time() - t0, 1))
    run.attempt("resnet18", with_wbc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("work")
    ap.add_argument("--no-cpu", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="seconds from the start after which no case is begun (0: none)")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    run = Run(a.work, set(filter(None, a.only.split(","))), a.deadline_s)
    torch.manual_seed(0)
    dev = "cuda"
    run.family(CAUSAL_LMS + (() if a.no_cpu else ("gpt2_fp32_cpu",)), causal_lms, run, dev,
               a.no_cpu)
    torch.manual_seed(7)
    run.family(("llama_tied_torch", "llama_tied_embedded_torch", "llama_tied"), llama_tied, run,
               dev)
    run.family(("bert_mlm_torch", "bert_mlm"), bert_mlm, run, dev)
    run.family(("resnet18_torch", "resnet18"), resnet18, run, dev)
    run.save(complete=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
