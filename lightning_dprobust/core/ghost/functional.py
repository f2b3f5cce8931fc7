"""Per-example gradients of parameters used by functional calls outside any layer call, captured on the autograd
graph after the forward.

**Broadcast parameters** (:class:`BroadcastRule`): class, register and distillation tokens (``token.expand(B, -1,
-1)``, then concatenated to the patch embeddings), position embeddings (``x + pos_embed``) and scales (``gamma *
branch(x)``), in any model (BEiT, EVA, XCiT, CoaT, a user's own vision transformer or block). Such a use is one
autograd node, an expand, an add or a product, and the gradient ``g`` at its output gives each row's gradient of the
parameter: ``g`` itself for an expand or an add, ``g * y`` for a product with ``y``, summed over the dims the
parameter was broadcast along. An example's gradient is the sum over its rows. :func:`capture_on_graph` finds the
nodes that take each covered parameter and captures each node's output edge as a call of that one node (``y``, which
autograd saved for the product's backward, is its input). A 1-D parameter concatenated into a bias that one node
adds to every row (BEiT's and EVA's ``cat((q_bias, k_bias, v_bias))``) is captured at that node, its piece sliced out
of the gradient there. Planned for the parameters no other rule covers (:func:`broadcast_rules`), and tried on the
first forward for those of the modules planned for a re-run (``CompositeRule``), which give way where every use is
captured.

**Linear weights used by** ``F.linear`` **without calling their layer** (BEiT's and EVA's attention, which add a bias
of their own to ``qkv.weight``'s product): the product node (``addmm`` or ``mm`` of the input rows and ``weight.t()``,
with the layer's own bias or, when the layer has none to clip, any) is captured as a call of the layer's
:class:`~lightning_dprobust.core.ghost.layers.LinearRule`, with the input rows autograd saved for it; the rule
then treats it as any call of the layer. :func:`capture_on_graph` makes both kinds of capture in one graph walk.

**Layers applied to a tensor the batch shares, then repeated per example** (XCiT's Fourier position encoding: a
``1 x 1`` convolution of a grid, ``.repeat(B, 1, 1, 1)``): the call's rows are not examples', but the layer applied
to the repeated input gives the repeat's output, whose rows are. :func:`spread_shared_calls` makes that the call:
its input repeated as the repeat does, its output edge the repeat's, when the repeat (along the leading dim only) is
the only node that takes the layer's output.

Any other use (a slice or a resampled copy of an embedding, an add with ``alpha``, the parameter twice in one node,
a product with a scaled copy of the weight, a penalty in the loss) is not captured, so the graph check
(``core/ghost/graph.py``) finds the parameter reached outside its rule's calls and moves it to the vmap engine: a
capture is exact where it is made at all. Rows are assumed to be examples' (consecutive), as for every rule; the
first-step check compares each rule's norms with the vmap engine's and sends a capture that fails (a parameter
broadcast over tokens instead of examples, a product of token-major rows) to the vmap engine. Relies on private
autograd attributes: a node's ``_input_metadata`` (the shape of the gradient it receives), its ``_saved_*`` tensors
and scalars, and (``graph``) ``_sequence_nr``; where torch lacks one, nothing is captured and the vmap engine
takes over.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.autograd.graph import GradientEdge
from torch.nn.utils.parametrize import ParametrizationList

from lightning_dprobust.core.ghost.graph import inside_call
from lightning_dprobust.core.ghost.layers import Capture, Hook, LinearRule, MaterializedRule, group_rows


@dataclass
class BroadcastUse(Capture):
    """One captured use: ``inputs`` is the other factor ``y`` of a product (``scaled``), else the parameter itself
    (so that the version check sees an in-place change of either); ``part`` is the parameter's local name;
    ``segment`` the parameter's place in a concatenated bias (the gradient's last dim), if it is one."""

    scaled: bool = False
    segment: slice | None = None


class BroadcastRule(MaterializedRule):
    """Parameters used whole by an expand, an add or a product that broadcasts them over the rows (module
    docstring)."""

    def capture_hooks(self) -> list[Hook]:
        return []  # captured on the graph after the forward (capture_on_graph)

    def gradients_of(self, call: BroadcastUse, grad: Tensor, examples: int) -> dict[str, Tensor]:
        parameter = self.tensors()[call.part]
        rows = group_rows(grad * call.inputs if call.scaled else grad, examples).sum(dim=1)  # [B, *row shape]
        if call.segment is not None:  # a piece of a bias added to every row: the sum over positions, sliced
            per_example = rows.reshape(examples, -1, rows.shape[-1]).sum(dim=1)[:, call.segment]
        else:
            per_example = rows.sum_to_size(examples, *_row_shape(parameter, grad.dim()))
        return {call.part: per_example.reshape(examples, *parameter.shape).to(parameter.dtype)}


def broadcast_rules(module: nn.Module, names: dict[str, str]) -> list[BroadcastRule]:
    """One :class:`BroadcastRule` per parameter of ``module`` among ``names`` (``local -> full name``, none of which
    has another rule), so that a use one of them makes outside the rule sends only that one to the vmap engine; none
    for a parametrization's originals, which are used through the parametrization only."""
    if isinstance(module, ParametrizationList):
        return []
    return [BroadcastRule(module, {local: full}) for local, full in names.items()]


def capture_on_graph(losses: Tensor, broadcast: list[BroadcastRule], linears: list[LinearRule]) -> None:
    """Capture, on the autograd graph of ``losses`` (one walk), the ``broadcast`` rules' uses of their parameters and
    the ``linears`` rules' ``F.linear`` products outside their layers' calls; other uses are left uncaptured (module
    docstring)."""
    owners = {id(p): (rule, local, p) for rule in broadcast for local, p in rule.tensors().items()}
    owners |= {
        id(rule.module.weight): (rule, "weight", rule.module.weight) for rule in linears if "weight" in rule.names
    }
    if not owners:
        return
    examples = losses.shape[0]
    uses = list(_parameter_uses(losses, owners))
    counts = Counter(id(variable) for _, variable, _ in uses)
    for node, variable, parents in uses:
        rule, local, parameter = owners[id(variable)]
        if isinstance(rule, BroadcastRule):
            _capture_broadcast(rule, local, parameter, node, parents, examples, counts[id(variable)] == 1)
        else:
            _capture_functional_linear(rule, node, parents, examples)


def spread_shared_calls(losses: Tensor, calls: list[Capture], examples: int) -> list[Capture]:
    """Make each of ``calls`` (of linear and convolution layers, on a tensor the batch shares) the layer's call on
    its input repeated along the leading dim, with the repeat's output edge, where one repeat along that dim is the
    only node of the losses' graph that takes the call's output and its output's rows are a multiple of
    ``examples`` (module docstring). Returns the calls changed; the others are left as they were."""
    if not calls:
        return []
    takers = _takers(losses, {(call.edge.node, call.edge.output_nr) for call in calls})
    spread = []
    for call in calls:
        repeat = _leading_repeat(takers.get((call.edge.node, call.edge.output_nr), []))
        if repeat is None or call.shape[0] * repeat[1] % examples:
            continue
        node, copies = repeat
        call.check_unchanged()
        call.inputs = call.inputs.repeat(copies, *[1] * (call.inputs.dim() - 1))
        call.version, call.edge = call.inputs._version, GradientEdge(node, 0)
        call.shape = torch.Size((call.shape[0] * copies, *call.shape[1:]))
        spread.append(call)
    return spread


def _takers(losses: Tensor, edges: set[tuple[object, int]]) -> dict[tuple[object, int], list[object]]:
    """``edge -> the nodes of the losses' graph that take it`` (each node once per input it takes it at), for
    ``edges``."""
    root = losses.grad_fn
    stack, seen, takers = ([root] if root is not None else []), set(), {}
    while stack:
        node = stack.pop()
        for child, nr in node.next_functions:
            if (child, nr) in edges:
                takers.setdefault((child, nr), []).append(node)
            if child is not None and child not in seen and not hasattr(child, "variable"):
                seen.add(child)
                stack.append(child)
    return takers


def _leading_repeat(takers: list[object]) -> tuple[object, int] | None:
    """``(node, copies)`` when ``takers`` is one ``repeat`` along the leading dim only (no dim added)."""
    if len(takers) != 1 or takers[0].name() != "RepeatBackward0":
        return None
    repeats = tuple(getattr(takers[0], "_saved_repeats", ()))
    dims = len(getattr(takers[0], "_saved_self_sym_sizes", ()))
    if not repeats or len(repeats) != dims or any(r != 1 for r in repeats[1:]) or repeats[0] < 1:
        return None
    return takers[0], repeats[0]


def _capture_broadcast(
    rule: BroadcastRule, local: str, parameter: Tensor, node: object, parents: list, examples: int, only_use: bool
) -> None:
    """A use of a broadcast parameter by ``node``, or as a piece of a bias (its ``only_use``: that call spans the
    nodes from the concatenation to the add, so no other use may lie there)."""
    use = _use(node, parameter, examples)
    start = node._sequence_nr() - 1  # the call is this node (and, for a bias segment, the node it feeds)
    if use is not None:
        factor, shape = use
        inputs = parameter.detach() if factor is None else factor
        edge = GradientEdge(node, 0)
        rule.calls.append(
            BroadcastUse(inputs, inputs._version, edge, shape, start, part=local, scaled=factor is not None)
        )
    elif only_use and (segment := _bias_segment(node, parameter, parents, examples)):
        target, shape, place = segment
        edge = GradientEdge(target, 0)
        rule.calls.append(
            BroadcastUse(parameter.detach(), parameter._version, edge, shape, start, part=local, segment=place)
        )


def _capture_functional_linear(rule: LinearRule, node: object, parents: list, examples: int) -> None:
    """A product ``x @ weight.t()`` (``F.linear``) of the rule's weight outside the layer's own calls, with the input
    rows ``x`` autograd saved for it, as a call of the rule (its start just before the ``t`` node)."""
    if node.name() != "TBackward0" or len(parents) != 1 or any(inside_call(node, call) for call in rule.calls):
        return
    product, position = parents[0]
    inputs = _product_rows(product, position)
    if inputs is not None and inputs.shape[0] % examples == 0 and _same_bias(product, rule):
        edge, shape = GradientEdge(product, 0), torch.Size((inputs.shape[0], rule.module.weight.shape[0]))
        rule.calls.append(Capture(inputs.detach(), inputs._version, edge, shape, node._sequence_nr() - 1))


def _same_bias(product: object, rule: LinearRule) -> bool:
    """Whether ``product`` adds the rule's bias when the rule covers one (the rule reads the bias's per-example
    gradient from the product's output gradient): an ``addmm`` whose bias is the layer's own, unchanged."""
    if "bias" not in rule.names:
        return True
    bias = product.next_functions[0][0] if product.name() == "AddmmBackward0" else None
    return getattr(bias, "variable", None) is rule.module.bias


def _product_rows(product: object, position: int) -> Tensor | None:
    """The input rows ``[M, d]`` of ``product`` when it is ``addmm(bias, x, weight.t())`` (``alpha`` 1) or ``mm(x,
    weight.t())`` with ``weight.t()`` at ``position`` (its second factor), else ``None``."""
    try:
        if product.name() == "AddmmBackward0" and position == 2 and product._saved_alpha == 1:
            return product._saved_mat1
        if product.name() == "MmBackward0" and position == 1:
            return product._saved_self
    except (AttributeError, RuntimeError):  # no such attribute in this torch, or changed in place since
        return None
    return None


def _parameter_uses(losses: Tensor, owners: dict[int, object]) -> Iterator[tuple[object, Tensor, list]]:
    """``(node, parameter, parents)`` for each node of the losses' graph that takes one of ``owners``' parameters
    directly (its ``AccumulateGrad`` among the node's next functions), each node once, with the ``(node, position)``
    pairs that take ``node``."""
    root = losses.grad_fn
    stack, parents, uses = ([root] if root is not None else []), {}, []
    while stack:
        node = stack.pop()
        used = set()
        for position, (child, _) in enumerate(node.next_functions):
            variable = getattr(child, "variable", None)
            if variable is None and child is not None:
                if child not in parents:
                    parents[child] = []
                    stack.append(child)
                parents[child].append((node, position))
            elif variable is not None and id(variable) in owners and id(variable) not in used:
                used.add(id(variable))
                uses.append((node, variable))
    return ((node, variable, parents.get(node, [])) for node, variable in uses)


def _use(node: object, parameter: Tensor, examples: int) -> tuple[Tensor | None, torch.Size] | None:
    """``(y, output shape)`` when ``node`` is a product ``parameter * y`` (``None`` for ``y`` when it is an expand
    or an add ``x + parameter``) that takes the parameter once and broadcasts it over its output's rows, whose
    count is a multiple of ``examples``; otherwise ``None``."""
    name = node.name()
    if name not in ("ExpandBackward0", "AddBackward0", "MulBackward0"):
        return None
    positions = [i for i, (child, _) in enumerate(node.next_functions) if getattr(child, "variable", None) is parameter]
    metadata = getattr(node, "_input_metadata", None)
    if len(positions) != 1 or not metadata or len(metadata) != 1:
        return None
    shape = torch.Size(metadata[0].shape)
    if not shape or shape[0] % examples or not _broadcast_over_rows(parameter, shape):
        return None
    if name == "AddBackward0":
        return (None, shape) if getattr(node, "_saved_alpha", None) == 1 else None
    if name == "ExpandBackward0":
        return None, shape
    try:  # the product's other factor, as autograd saved it (an in-place change since would raise here)
        factor = node._saved_other if positions[0] == 0 else node._saved_self
    except (AttributeError, RuntimeError):
        return None
    return (factor.detach(), shape) if isinstance(factor, Tensor) else None


def _bias_segment(
    node: object, parameter: Tensor, parents: list, examples: int
) -> tuple[object, torch.Size, slice] | None:
    """``(node it feeds, that node's output shape, the parameter's place)`` when ``node`` concatenates the 1-D
    ``parameter`` once with other pieces into a bias that one node adds to every row: an ``addmm`` (``F.linear``'s
    bias, ``beta`` 1) or an add (``alpha`` 1) whose output's last dim is the bias and whose row count is a multiple of
    ``examples`` (BEiT's and EVA's ``cat((q_bias, k_bias, v_bias))``). Piece sizes come from the parameters and the
    shapes autograd recorded; at most one piece without gradient may have an unknown size (the zero key bias)."""
    if node.name() != "CatBackward0" or parameter.dim() != 1 or getattr(node, "_saved_dim", None) not in (0, -1):
        return None
    if len(parents) != 1:
        return None
    target, position = parents[0]
    name, metadata = target.name(), getattr(target, "_input_metadata", None)
    if not metadata or len(metadata) != 1:
        return None
    shape = torch.Size(metadata[0].shape)
    feeds_bias = (name == "AddmmBackward0" and position == 0 and getattr(target, "_saved_beta", None) == 1) or (
        name == "AddBackward0" and getattr(target, "_saved_alpha", None) == 1
    )
    if not feeds_bias or len(shape) < 2 or shape[0] % examples:
        return None
    sizes = [_piece_size(child, nr) for child, nr in node.next_functions]
    if (
        sizes.count(None) > 1
        or sum(child is not None and getattr(child, "variable", None) is parameter for child, _ in node.next_functions)
        != 1
    ):
        return None
    known = sum(size for size in sizes if size is not None)
    sizes = [shape[-1] - known if size is None else size for size in sizes]
    if min(sizes) < 0 or sum(sizes) != shape[-1]:
        return None
    index = next(i for i, (child, _) in enumerate(node.next_functions) if getattr(child, "variable", None) is parameter)
    offset = sum(sizes[:index])
    return target, shape, slice(offset, offset + sizes[index])


def _piece_size(child: object, output_nr: int) -> int | None:
    """The length of a 1-D piece of a concatenation from its autograd node (``None`` for a piece without gradient)."""
    variable = getattr(child, "variable", None)
    if variable is not None:
        return variable.shape[0] if variable.dim() == 1 else -1
    metadata = getattr(child, "_input_metadata", None) if child is not None else None
    if not metadata:
        return None
    shape = metadata[output_nr].shape
    return shape[0] if len(shape) == 1 else -1


def _row_shape(parameter: Tensor, dims: int) -> tuple[int, ...]:
    """The shape of one row's gradient of ``parameter`` in an output of ``dims`` dims: the parameter's shape without
    its leading 1 when it has as many dims, else right-aligned with leading 1s."""
    if parameter.dim() == dims:
        return tuple(parameter.shape[1:])
    return (1,) * (dims - 1 - parameter.dim()) + tuple(parameter.shape)


def _broadcast_over_rows(parameter: Tensor, shape: torch.Size) -> bool:
    """Whether ``parameter`` broadcast to ``shape`` is the same for every row (one row, or fewer dims)."""
    if parameter.dim() > len(shape) or (parameter.dim() == len(shape) and parameter.shape[0] != 1):
        return False
    row = _row_shape(parameter, len(shape))
    return all(r in (1, s) for r, s in zip(row, shape[1:], strict=True))
