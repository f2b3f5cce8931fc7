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
    """The greatest autograd sequence number given so far on this thread: every node created after this call has a
    greater one (autograd numbers its nodes from one per-thread counter; this reads it, creating no node)."""
    return torch.autograd._get_sequence_nr() - 1


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


def reaches(node: object, targets: set, dead_ends: set) -> bool:
    """Whether a path leads from ``node`` down its ``next_functions`` to one of the ``targets`` nodes (``node``
    itself not counted). Of the nodes of the losses' graph, ``torch.autograd.grad`` asked for the gradients at edges
    of ``targets`` runs exactly those that reach one (a target that reaches none only has its incoming gradient
    recorded, it is not run). The walk stops at the first target found, so a layer's output node, whose input
    usually comes from a target a node or two below, costs a few steps, not a graph walk. ``dead_ends`` collects the
    nodes proven to reach none (every node of a walk that found none); sharing it between calls, no node is walked
    twice in vain."""
    stack, seen = [node], set()
    while stack:
        for child, _ in stack.pop().next_functions:
            if child is None or child in seen or child in dead_ends:
                continue
            if child in targets:
                return True
            seen.add(child)
            stack.append(child)
    dead_ends |= seen
    return False
