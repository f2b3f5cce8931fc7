"""Which layer rules' parameters receive gradient outside the layer calls the ghost engine captured.

The ghost engine (``core/ghost.py``) derives a parameter's per-example gradient from the captured calls of its layer
only: the layer's inputs and the gradients at its outputs. A loss term that uses the parameter elsewhere (a weight
penalty ``lam * w.pow(2).sum()`` inside the per-example loss, ``F.linear(x, layer.weight)`` without calling the
layer, a parameter shared by two layers) adds gradient that no rule sees, so the engine's norms and clipped sum would
be wrong and the clipping bound would not hold.

:func:`stray_rules` finds such parameters structurally, on the autograd graph of every step: it walks the graph
backward from the losses and tracks, along each path, whether the path is inside a captured call (it entered through
the call's captured output edge and has since visited only nodes created during that call, i.e. whose autograd
sequence numbers lie between the call's start marker and its output). A path that reaches a rule's parameter
(``AccumulateGrad`` node) other than from inside one of that rule's calls makes the rule stray. The walk visits
each (node, call) pair once, so it costs time linear in the graph size and no tensor work.

Assumption: the forward runs on one thread (autograd sequence numbers are per thread), as in any ordinary
``forward``; nodes are never shared between calls of different layers except through the calls' inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def sequence_marker() -> int:
    """An autograd sequence number greater than every node created so far (a fresh node's, or -1 without grad)."""
    node = torch.empty(0, requires_grad=True).view(0).grad_fn
    return node._sequence_nr() if node is not None else -1


def _entries(rules: Sequence) -> dict[tuple[object, int], tuple[object, object]]:
    """Captured output edge ``(node, output_nr)`` -> ``(call, rule)``."""
    return {(call.edge.node, call.edge.output_nr): (call, rule) for rule in rules for call in rule.calls}


def _inside(node: object, call: object) -> bool:
    return call.start < node._sequence_nr() <= call.edge.node._sequence_nr()


def stray_rules(losses: Tensor, rules: Sequence) -> list:
    """The rules of ``rules`` one of whose parameters gets gradient from ``losses`` outside the rule's own calls.

    ``rules`` are :class:`~lightning_dprobust.core.ghost_layers.LayerRule` objects whose ``calls`` were captured in
    the forward that computed ``losses`` (each call with its output ``edge`` and ``start`` marker).
    """
    owner = {id(p): rule for rule in rules for p in rule.tensors().values()}
    entries = _entries(rules)
    stray: dict[int, object] = {}
    root = losses.grad_fn
    stack: list[tuple[object, int, tuple | None]] = [(root, 0, None)] if root is not None else []
    seen: set[tuple[object, int]] = set()
    while stack:
        node, output_nr, state = stack.pop()
        state = entries.get((node, output_nr), state)
        variable = getattr(node, "variable", None)
        if variable is not None:  # AccumulateGrad of a leaf: legitimate only from inside its own rule's call
            rule = owner.get(id(variable))
            if rule is not None and (state is None or state[1] is not rule):
                stray[id(rule)] = rule
            continue
        if state is not None and not _inside(node, state[0]):
            state = None
        key = (node, id(state[0]) if state is not None else 0)
        if key in seen:
            continue
        seen.add(key)
        stack.extend((child, nr, state) for child, nr in node.next_functions if child is not None)
    return list(stray.values())


def executed_nodes(losses: Tensor, captured: set) -> set:
    """The nodes of ``losses``' graph that ``torch.autograd.grad`` runs when asked for gradients at edges of the
    ``captured`` nodes: those with a path to a captured node (the engine's "needed" nodes; a captured node with no
    such path only has its incoming gradient recorded, it is not run). The graph is a DAG, so one post-order walk
    with memoization decides every node."""
    needed: dict[object, bool] = {}
    root = losses.grad_fn
    stack: list[tuple[object, bool]] = [(root, False)] if root is not None else []
    while stack:
        node, expanded = stack.pop()
        children = [child for child, _ in node.next_functions if child is not None]
        if expanded:
            needed[node] = any(child in captured or needed[child] for child in children)
        elif node not in needed:
            needed[node] = False  # a placeholder until its children are decided (no cycles: never read before)
            stack.append((node, True))
            stack.extend((child, False) for child in children if child not in needed)
    return {node for node, is_needed in needed.items() if is_needed}
