"""Which layer rules' parameters receive gradient outside the layer calls the ghost engine captured.

The ghost engine (``clipper.py``) derives a parameter's per-example gradient from the captured calls of its layer
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

Calls nest: a module with a composite rule calls layers with rules of their own, whose calls lie inside its call
(and may end at its output edge). A path keeps the chain of calls it is inside, innermost first, leaves a call once it
reaches a node created before it, and reaches a parameter legitimately from inside any call of its rule in the chain.
Chains are numbered once, so the walk still visits each (node, chain) pair once.

Assumption: the forward runs on one thread (autograd sequence numbers are per thread), as in any ordinary
``forward``; nodes are never shared between calls of different layers except through the calls' inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor


def sequence_marker() -> int:
    """The greatest autograd sequence number given so far on this thread: every node created after this call has a
    greater one (autograd numbers its nodes from one per-thread counter; this reads it, creating no node)."""
    return torch.autograd._get_sequence_nr() - 1


def _entries(rules: Sequence) -> dict[tuple[object, int], list[tuple[object, object]]]:
    """Captured output edge ``(node, output_nr)`` -> the ``(call, rule)`` pairs whose output it is, outermost first
    (a module whose last layer's output is its own, as a window attention ending in its projection)."""
    entries: dict[tuple[object, int], list[tuple[object, object]]] = {}
    for rule in rules:
        for call in rule.calls:
            entries.setdefault((call.edge.node, call.edge.output_nr), []).append((call, rule))
    return {edge: sorted(pairs, key=lambda pair: pair[0].start) for edge, pairs in entries.items()}


def inside_call(node: object, call: object) -> bool:
    """Whether ``node`` was created during ``call`` (its sequence number lies in the call's range)."""
    return call.start < node._sequence_nr() <= call.edge.node._sequence_nr()


def stray_rules(losses: Tensor, rules: Sequence) -> list:
    """The rules of ``rules`` one of whose parameters gets gradient from ``losses`` outside the rule's own calls.

    ``rules`` are :class:`~lightning_dprobust.core.ghost.layers.LayerRule` objects whose ``calls`` were captured in
    the forward that computed ``losses`` (each call with its output ``edge`` and ``start`` marker). Calls nest (a
    :class:`~lightning_dprobust.core.ghost.layers.CompositeRule`'s module calls layers with rules of their own): a
    path keeps the chain of calls it is inside, and a parameter is reached legitimately from inside any call of its
    rule in that chain.
    """
    owner = {id(p): rule for rule in rules for p in rule.tensors().values()}
    entries = _entries(rules)
    stray: dict[int, object] = {}
    root = losses.grad_fn
    stack: list[tuple[object, int, _Chain | None]] = [(root, 0, None)] if root is not None else []
    seen: set[tuple[object, int]] = set()
    chains: dict[tuple[int, int], _Chain] = {}  # one object per chain, so that a chain is known by its number
    while stack:
        node, output_nr, chain = stack.pop()
        variable = getattr(node, "variable", None)
        if variable is not None:  # AccumulateGrad of a leaf: legitimate only from inside its own rule's call
            rule = owner.get(id(variable))
            if rule is not None and not (chain is not None and chain.has(rule)):
                stray[id(rule)] = rule
            continue
        while chain is not None and not inside_call(node, chain.call):  # left these calls: leave them first
            chain = chain.outer
        for call, rule in entries.get((node, output_nr), ()):  # entered calls, outermost first
            outer = chain
            chain = chains.get((id(call), id(outer)))
            if chain is None:
                chain = chains[id(call), id(outer)] = _Chain(call, rule, outer, len(chains) + 1)
        key = (node, chain.number if chain is not None else 0)
        if key in seen:
            continue
        seen.add(key)
        stack.extend((child, nr, chain) for child, nr in node.next_functions if child is not None)
    return list(stray.values())


class _Chain(NamedTuple):
    """The captured calls a path of the walk is inside, innermost first."""

    call: object
    rule: object
    outer: _Chain | None
    number: int

    def has(self, rule: object) -> bool:
        return self.rule is rule or (self.outer is not None and self.outer.has(rule))


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
