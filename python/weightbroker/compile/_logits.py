"""The module exported for a Hugging Face language model (imports torch)."""

import torch


class LogitsOnly(torch.nn.Module):
    """input_ids -> logits of a Hugging Face language model: a causal LM
    without its cache (use_cache=False, the default), or another head with
    use_cache=None (the argument is then not passed, as a masked LM takes
    none). Its FQNs are "model.<checkpoint name>": strip_prefix "model."
    maps them back."""

    def __init__(self, model, use_cache=False):
        super().__init__()
        self.model = model
        self.kwargs = {} if use_cache is None else {"use_cache": use_cache}

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, **self.kwargs).logits
