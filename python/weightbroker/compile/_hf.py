"""Hugging Face checkpoints (save_pretrained directories): which head a
checkpoint has, and the module exported for it. The task is read from
config.json without transformers, so that the command line can check its
arguments before importing torch."""

import json
import os

TASKS = ("causal-lm", "masked-lm")

# Suffixes of config.json's "architectures" entries, by task.
_ARCH_SUFFIXES = {"causal-lm": ("ForCausalLM", "LMHeadModel"), "masked-lm": ("ForMaskedLM",)}


def read_config(checkpoint):
    """config.json of a checkpoint directory, as a dict."""
    path = os.path.join(checkpoint, "config.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise ValueError("%s: no config.json (%s); is it a save_pretrained directory?"
                         % (checkpoint, e.strerror)) from None
    except ValueError as e:
        raise ValueError("%s: config.json is not JSON: %s" % (checkpoint, e)) from None
    if not isinstance(config, dict):
        raise ValueError("%s: config.json is no JSON object" % checkpoint)
    return config


def task_of(config):
    """"causal-lm" or "masked-lm", from config.json's architectures; a
    ValueError naming them when neither fits."""
    archs = config.get("architectures") or []
    if not isinstance(archs, list):
        archs = [archs]
    found = {task for task, suffixes in _ARCH_SUFFIXES.items()
             for a in archs if isinstance(a, str) and a.endswith(suffixes)}
    if len(found) == 1:
        return found.pop()
    raise ValueError("cannot tell the task from config.json's architectures %s: give --task "
                     "(%s)" % (archs or "(none)", " or ".join(TASKS)))


def load(checkpoint, task, device, dtype=None):
    """(eval-mode model on `device`, its wrapper LogitsOnly) of a checkpoint
    directory; transformers is imported here."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    from ._logits import LogitsOnly

    cls = AutoModelForCausalLM if task == "causal-lm" else AutoModelForMaskedLM
    kw = {"dtype": getattr(torch, dtype)} if dtype else {}
    model = cls.from_pretrained(checkpoint, **kw).to(device).eval()
    wrapper = LogitsOnly(model, use_cache=False if task == "causal-lm" else None)
    return model, wrapper
