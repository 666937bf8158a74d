"""The constants an exported program writes. libwbclient refuses to bind
those to shared weights (a write would change every worker's weights, or
fault on a read-only mapping) unless asked for a private copy."""

import sys


def _written_base(node):
    """The placeholder a view chain ends in (`self.cache[0, 1] = x` writes
    through select/slice views of the buffer), or None."""
    seen = 0
    while node is not None and seen < 64:
        if getattr(node, "op", None) == "placeholder":
            return node
        if getattr(node, "op", None) != "call_function" or not node.args:
            return None
        schema = getattr(node.target, "_schema", None)
        # Only ops whose result aliases their first argument (views, and
        # in-place ops that return self) lead back to the storage written.
        if schema is None or not schema.returns or schema.returns[0].alias_info is None:
            return None
        node, seen = node.args[0], seen + 1
    return None


def mutated_buffers_by_source(ep):
    """The constants the exported program writes, found three ways:

    * "signature": graph_signature.buffers_to_mutate as export returned it;
    * "graph": in-place and out= ops in the graph whose written argument is
      (a view of) a buffer or parameter placeholder. torch.export.export
      returns the training IR since torch 2.6, which keeps
      `self.count.add_(1)` as an in-place op and does not list it in
      buffers_to_mutate (on torch 2.11 that list came back empty for such a
      module);
    * "decomposed": buffers_to_mutate after ep.run_decompositions(), the
      functional form the compiler lowers.
    Each is a sorted list of FQNs."""
    if ep is None:
        return {"signature": [], "graph": [], "decomposed": []}
    sig = ep.graph_signature
    owners = dict(getattr(sig, "inputs_to_parameters", {}) or {})
    owners.update(getattr(sig, "inputs_to_buffers", {}) or {})
    graph = set()
    for node in ep.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for i, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            val = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            for v in (val if isinstance(val, (list, tuple)) else (val,)):
                base = _written_base(v)
                if base is not None and base.name in owners:
                    graph.add(owners[base.name])
    try:
        decomposed = set(ep.run_decompositions().graph_signature.buffers_to_mutate.values())
    except Exception as e:  # the compile that follows reports it properly
        print("weightbroker.compile: run_decompositions failed (%s); mutated buffers from the "
              "graph only" % e, file=sys.stderr)
        decomposed = set()
    return {"signature": sorted(set(sig.buffers_to_mutate.values())), "graph": sorted(graph),
            "decomposed": sorted(decomposed)}


def mutated_buffers(ep):
    """FQNs of the constants the exported program writes (BatchNorm running
    statistics in training mode, caches, counters): the compiled graph
    writes those constants, so workers must not bind them to shared,
    read-only weights. The union of mutated_buffers_by_source."""
    return sorted(set().union(*mutated_buffers_by_source(ep).values()))
