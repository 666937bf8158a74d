"""Compiles a PyTorch model with AOTInductor for weightbroker workers.

The package is compiled with its constants OUTSIDE the model library
(aot_inductor.package_constants_in_so = False): a worker binds the weights
that the broker leases, by their checkpoint names, without copying them.
What the checkpoint lacks is written now, into a small safetensors file
stored in the package as <archive>/weightbroker/constants.safetensors:

* tensors that are in no checkpoint and tied to none: non-persistent buffers
  (a rotary embedding's inv_freq, BERT's position_ids and token_type_ids,
  causal masks) and tensor constants, keyed by the model's FQN; the worker
  copies them into private memory;
* in its metadata, "weightbroker.aliases": "name=target,...": every constant
  that is in no checkpoint but shares its storage with one that is (tied
  weights: save_pretrained keeps transformer.wte.weight and drops
  lm_head.weight; a masked LM's decoder weight and bias); the worker binds
  both to the one leased tensor. Ties are found from the eager model itself
  (parameters that are the same tensor), which is what config.json's
  tie_word_embeddings produces, so the config is not read; a tie the model
  does not show must be given to the worker with --alias;
* "weightbroker.strip_prefix" / "weightbroker.prefix": how the model's FQNs
  become checkpoint names (a model exported inside a wrapper has FQNs
  "model.<name>");
* "weightbroker.mutated": the buffers the exported program writes (its
  in-place ops on buffers, and graph_signature.buffers_to_mutate before and
  after run_decompositions); libwbclient refuses to bind them to shared
  weights unless asked for a private copy.

libwbclient finds the file by itself (wb_container_options.constants_file or
wb-aoti-worker --constants name another one; --alias, --strip-prefix and
--prefix add to or replace what it says).

Library use, for any torch.nn.Module:
    from weightbroker.compile import compile_package
    info = compile_package(module, (input_ids,), "model.pt2",
                           checkpoint="ckpt_dir", strip_prefix="model.",
                           dynamic_batch=True, dynamic_seq=True)

Command line, for a Hugging Face checkpoint saved with save_pretrained:
    python3 -m weightbroker.compile hf CHECKPOINT_DIR OUT.pt2

torch is imported only when a model is compiled: importing this module and
--help need none, and a torch without torch.export gets a clear error
(TorchUnsupportedError)."""

from ._checkpoint import checkpoint_names, map_name
from ._constants import ENTRY, FORMAT, constants_metadata, save_tensors, write_constants
from ._hf import TASKS, read_config, task_of
from ._mutated import mutated_buffers, mutated_buffers_by_source
from ._package import TorchUnsupportedError, compile_package, dynamic_spec, require_torch
from ._plan import model_tensors, plan

__all__ = [
    "ENTRY", "FORMAT", "TASKS", "TorchUnsupportedError", "checkpoint_names",
    "compile_package", "constants_metadata", "dynamic_spec", "map_name", "model_tensors",
    "mutated_buffers", "mutated_buffers_by_source", "plan", "read_config", "require_torch",
    "save_tensors", "task_of", "write_constants",
]


def __getattr__(name):
    # LogitsOnly is a torch.nn.Module: defined when first asked for, so
    # that importing this package (also with *, hence not in __all__)
    # needs no torch.
    if name == "LogitsOnly":
        from ._logits import LogitsOnly
        return LogitsOnly
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
