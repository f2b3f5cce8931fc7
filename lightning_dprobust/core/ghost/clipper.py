"""Per-example clipping at close to non-private cost: ghost norms and book-keeping (Bu et al. 2023).

One forward of the per-example losses on the whole batch, one backward that computes only the gradients at the
layers' outputs (no parameter gradients: the autograd graph is cut at the captured output edges), per-layer
per-example norms from activations and output gradients (``core/ghost/layers.py``: ghost norm or materialization,
whichever is cheaper for the layer's shapes), then the clipped sum from the same tensors with the output gradients
scaled by each example's clip factor. Li et al. 2022 (arXiv 2110.05679, ghost clipping); Bu, Mao, Xu 2022 (arXiv
2205.10683, mixed ghost clipping); Bu, Wang, Zha, Karypis, ICML 2023 (arXiv 2210.00038, book-keeping).

Memory (mixed book-keeping): a layer whose per-example gradients (``B x p`` values) are no larger than its captured
inputs and output gradients (normalization layers, ViT tokens, convolutions with few input channels) is
*streamed*: a pre-hook on its output node forms its per-example gradients while the backward runs and drops its
captures at once, so only the other layers' captures are held until every norm is known. A layer whose output node
the backward does not run (the first layer: nothing below it needs a gradient) keeps its captures
(``streamed_rules``).

Activations and output gradients are captured with forward hooks and ``torch.autograd.graph.GradientEdge``s taken
at forward time, so an in-place op after a layer (timm ResNets' ``x += shortcut``) cannot alter what was captured;
an in-place change of a captured *input* is detected through its version counter and refused. No full backward
module hooks are used. The capture hooks run before a user's hooks on the same module, but after hooks registered for
every module (``register_module_forward_hook``), which could replace what they capture: while such a global forward
hook or pre-hook is registered, steps run on the vmap engine.

Guarantees (same as :class:`~lightning_dprobust.core.per_sample.PerExampleClipper`): each example's contribution to
the returned sum has L2 norm ``<= max_grad_norm``; frozen parameters and buffers are never differentiated. The rules
are planned again whenever the trainable parameters differ from those they were planned for (a layer frozen or
unfrozen mid-training, or replaced).

Assumptions, checked where possible:
    * every layer sees example ``i``'s rows as consecutive rows ``[i k, (i + 1) k)`` (true of ``x`` and of
      ``views.flatten(0, 1)``); a row count that is not a multiple of the batch size is refused;
    * no layer mixes examples (as for the vmap engine; BatchNorm is refused by ``DPCallback``);
    * layers handled by :class:`~lightning_dprobust.core.ghost.layers.MaterializedRule` are deterministic.
    The first call of two examples or more compares this engine's per-example norms, and each rule's share of them,
    with the vmap engine's on a few examples, **in the mode the model trains in** (training mode: a parameter-free
    batch standardization, ``F.batch_norm`` on batch statistics, any layer that mixes examples only while training is
    compared), with the stochastic layers that act on each value alone (dropout, drop-path) switched off in both
    engines so that their draws cannot differ; any other training-mode randomness makes the check fail, which is the
    safe side. It refuses to continue (or falls back to vmap, under ``auto``) on a mismatch; a capture made on the
    graph that fails goes to the vmap engine. The check runs again every :data:`CHECK_EVERY` calls: a per-example
    loss that starts to mix examples after the first step (a term on the batch's mean logits, switched on at some
    epoch) is found there. Such a **late** mismatch (ghost results were released since the last passing check) stops
    the run whatever ``on_mismatch`` says (``on_late_mismatch="raise"``): the steps since the last passing check had
    no bounded sensitivity, so no epsilon covers them. ``on_late_mismatch="fallback"`` goes on with the vmap engine
    and counts those steps in :attr:`GhostClipper.unbounded_calls` (``DPCallback`` then reports epsilon = inf). A
    later step whose forward first calls a layer, or adds a capture (a spread call, ``F.linear`` products), is
    checked so before its result is returned (a layer on a table of 5 rows all examples share, first called in a
    batch of 5, passes for the examples' rows and its norms were 3 % off); a warning names the layers that the
    training steps call but the check's forward on its few examples did not. A linear or
    convolution layer applied to a tensor the batch shares, then repeated per example, is captured at the repeat; a
    layer whose calls' rows are not a multiple of the examples otherwise goes to vmap.
A module owning parameters and sub-layers with parameters (Swin's window attention) is re-run per example for its own
parameters (:class:`~lightning_dprobust.core.ghost.layers.CompositeRule`), unless the first forward's graph captures
every use of them; calls nest, and the graph check follows them. A leaf module whose parameters are used but that is
never called (CoAtNet's and MaxViT's bias tables, read through a method), or a layer called on a table the examples
share, is handed to such a rule on its nearest ancestor that also holds a layer on the examples' rows. Parameters used
outside any layer call (tokens, position embeddings, scales, a linear weight used through ``F.linear``) are captured on
the autograd graph after the forward (``core/ghost/functional.py``). Parameters with neither (tied between modules, a
parametrization's originals, uses no capture takes) are handled by the vmap engine, restricted to those parameters;
their per-example gradients enter the same norms. At every step, the autograd graph of the losses is checked
(``core/ghost/graph.py``) for a rule's parameter that gets gradient outside its layer's captured calls (a weight penalty
in the loss, a weight used without calling its layer); such a rule's parameters move to the vmap engine before any norm
is computed, so the result stays exact.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Collection

import torch
from torch import Tensor, nn

from lightning_dprobust.core.ghost.functional import (
    BroadcastRule,
    broadcast_rules,
    capture_on_graph,
    spread_shared_calls,
)
from lightning_dprobust.core.ghost.graph import reaches, stray_rules
from lightning_dprobust.core.ghost.layers import (
    Capture,
    CompositeRule,
    LayerRule,
    LinearRule,
    MaterializedRule,
    UnsupportedCall,
    example_rows,
    parameter_count,
    split_rows,
    squared_norms,
)
from lightning_dprobust.core.ghost.plan import is_stochastic, plan_rules
from lightning_dprobust.core.per_sample import (
    ClippedSum,
    PerExampleClipper,
    clip_factors,
    float32_products,
)

log = logging.getLogger(__name__)

VERIFY_EXAMPLES = 3
"""Examples of a checked batch whose ghost norms, from the whole batch's pass, are compared with the vmap engine's
(:func:`check_rows`)."""
CHECK_EVERY = 100
"""The check against the vmap engine runs again at every this many-th call of two examples or more, so that a
per-example loss that starts to mix examples after the first step is found: the graph check sees which parameters a
path reaches, not which examples' rows it mixes. At batch 64 one check costs about one step on one CPU thread
(``cnn_tanh`` 6.1 ms against a 4.8 ms step, timm ResNet-18 167 ms against 151 ms), about 1 % of the training time at
this interval."""
PROBE_EXAMPLES = 2
"""Examples whose losses, computed alone, are compared at every step with their losses in the step's batch
(:meth:`GhostClipper._probe_mixes`)."""
_PROBE_RTOL, _PROBE_ATOL = 1e-4, 1e-6
_VERIFY_RTOL = 1e-3
_VERIFY_SHARE = 1e-5
"""Each rule's squared norms are checked too, to ``2 _VERIFY_RTOL`` relative and this fraction of the example's total
squared norm absolute (float32 rounding of a parameter whose gradient is nearly zero): a parameter with a small share
of the norm could otherwise be wrong unseen."""


STRAY = "get gradient outside their layers' calls (e.g. a penalty on the weights in the loss)"
UNSPLIT = (
    "have layer calls whose rows are not a multiple of the examples, so not split by example (e.g. a layer applied "
    "once to a tensor the whole batch shares, and not followed by a repeat per example alone)"
)

UNVERIFIED = (
    "are used outside any layer call and their per-example norms differed from the vmap engine's on the first step "
    "(rows that are not examples', e.g. a parameter broadcast over tokens, or a layer input laid out token-major)"
)


UNSEEN_BY_CHECK = (
    "ghost engine: the layers of %s are called by the training steps but not by the check's forward on its few "
    "examples (control flow that depends on the batch), so the check against the vmap engine cannot compare them: "
    "their norms rest on the structural checks alone (rows a multiple of the examples, the graph check). Use "
    "engine='vmap' if they may mix examples"
)

LATE_MISMATCH = (
    "ghost engine: a check against the vmap engine failed after {steps} steps whose results were released unchecked "
    "since the last passing check: a layer or a loss term started to mix examples (or to lay out rows otherwise than "
    "by example), so those steps had no bounded sensitivity and the run's epsilon no longer holds"
)


GLOBAL_HOOKS = (
    "ghost engine: a global module forward hook or pre-hook is registered (torch.nn.modules.module."
    "register_module_forward_hook / register_module_forward_pre_hook); it runs before the engine's capture hooks and "
    "may replace what they capture, so the per-example gradients of the steps run while one is registered come from "
    "the vmap engine"
)


def _global_forward_hooks() -> bool:
    """Whether a forward hook or pre-hook is registered for every module (``register_module_forward_hook``,
    ``register_module_forward_pre_hook``). ``nn.Module`` runs such hooks before a module's own, so the rules'
    capture hooks would see what they return instead of the tensor they capture: a layer's output, or a module's
    input that is another layer's output (the activated norms' output gradient is taken at their ``drop`` module's
    input). A replaced tensor's gradient is not the layer's: a doubled output would halve the norm."""
    module = torch.nn.modules.module
    return bool(getattr(module, "_global_forward_hooks", None) or getattr(module, "_global_forward_pre_hooks", None))


UNSUPPORTED = "are in a layer call the engine cannot capture"


def _naming(rule: LayerRule, hook):
    """``hook``, which names ``rule`` in the :class:`UnsupportedCall` it raises (the engine moves that rule)."""

    def run(*args, **kwargs):
        try:
            return hook(*args, **kwargs)
        except UnsupportedCall as error:
            error.rule = rule
            raise

    return run


def check_rows(batch: tuple[Tensor, ...], count: int) -> Tensor:
    """Indices of ``min(count, B)`` examples of ``batch`` chosen far apart: the first, then each time the example
    farthest (in squared L2 over every tensor of the batch) from those chosen, then, where the rest are copies of those,
    the first others. An adversarial batch of copies of one example and one canary has the canary among them."""
    size = batch[0].shape[0]
    chosen = [0]
    distance = _distance_to(batch, 0)
    while len(chosen) < min(count, size):
        row = int(distance.argmax())
        if distance[row] <= 0:
            break
        chosen.append(row)
        distance = torch.minimum(distance, _distance_to(batch, row))
    chosen += [row for row in range(size) if row not in chosen][: min(count, size) - len(chosen)]
    return torch.tensor(sorted(chosen), device=batch[0].device)


def _distance_to(batch: tuple[Tensor, ...], row: int) -> Tensor:
    """``[B]``: each example's squared L2 distance to example ``row``, over every tensor of the batch."""
    size = batch[0].shape[0]
    return sum((t.reshape(size, -1).float() - t[row].reshape(1, -1).float()).square().sum(dim=1) for t in batch)


def _acts_per_value(module: nn.Module) -> bool:
    """Whether ``module`` is a stochastic layer that draws for each value alone (dropout, drop-path): switched off
    in both engines during the check, it cannot make them differ, and it cannot mix examples."""
    return (isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0) or getattr(module, "drop_prob", 0) > 0


Passes = list[tuple[Tensor, dict[tuple[str, ...], Tensor]]]
"""A check's passes of this engine: ``(norms, squared norms per rule)`` at the checked examples."""


class EngineMismatch(RuntimeError):
    """The ghost engine's per-example norms differ from the vmap engine's on the same examples."""


def _runs_no_layer(node: object) -> bool:
    """Whether an output node only feeds leaves (the first layer's: its input needs no gradient), so that a backward
    asked for gradients at layer outputs never runs it."""
    return all(child is None or hasattr(child, "variable") for child, _ in node.next_functions)


def streamed_rules(rules: list[LayerRule], examples: int) -> list[LayerRule]:
    """The rules that prefer streaming and whose every call's output node the backward runs: a hook on a node that
    only has its gradient recorded would never fire, so such rules keep their captures. The backward asks for the
    output gradients of the other rules (the first layer's among them, whose node only feeds leaves); it runs a node
    when a path leads from it to one of theirs (:func:`reaches`)."""
    candidates = [
        rule
        for rule in rules
        if rule.calls and rule.prefers_streaming(examples) and not any(_runs_no_layer(c.edge.node) for c in rule.calls)
    ]
    if not candidates:  # e.g. the first layer alone
        return []
    chosen = {id(rule) for rule in candidates}
    kept = {call.edge.node for rule in rules if id(rule) not in chosen for call in rule.calls}
    dead_ends: set = set()
    return [rule for rule in candidates if all(reaches(call.edge.node, kept, dead_ends) for call in rule.calls)]


@contextlib.contextmanager
def _stream_hooks(rules: list[LayerRule], examples: int):
    """Pre-hooks on the streamed calls' output nodes: each passes its call's output gradient to its rule."""

    def hook_for(rule: LayerRule, call: Capture):
        return lambda grad_outputs: rule.stream(call, grad_outputs[call.edge.output_nr], examples)

    handles = [call.edge.node.register_prehook(hook_for(rule, call)) for rule in rules for call in rule.calls]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _without_onednn():
    """oneDNN (``torch.backends.mkldnn``) off inside the block, restored after."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = previous


@contextlib.contextmanager
def _float64(module: nn.Module, part: tuple[Tensor, ...]):
    """Inside the block, each floating-point parameter and buffer of ``module`` is replaced, in its owner, by a
    float64 copy (one copy per tensor, so that tied parameters stay tied; a parameter's copy is a parameter with its
    ``requires_grad``); yields ``part`` with its floating-point tensors in float64. Replaced by ``setattr``, so that a
    module that caches its tensors (``nn.LSTM``'s flat weights) follows. The original tensors are never touched and
    are put back after: their values, views, autograd accumulators and the hooks on those (DDP's gradient reduction)
    stay as they were. Raises what the device raises where it has no float64."""
    replaced: list[tuple[nn.Module, str, Tensor]] = []
    copies: dict[int, Tensor] = {}
    try:
        for owner in module.modules():
            for store in (owner._parameters, owner._buffers):
                for name, tensor in list(store.items()):
                    if tensor is None or not tensor.is_floating_point() or tensor.dtype == torch.float64:
                        continue
                    if id(tensor) not in copies:
                        wide = tensor.detach().to(torch.float64)
                        parameter = isinstance(tensor, nn.Parameter)
                        copies[id(tensor)] = nn.Parameter(wide, tensor.requires_grad) if parameter else wide
                    replaced.append((owner, name, tensor))
                    setattr(owner, name, copies[id(tensor)])
        yield tuple(t.to(torch.float64) if t.is_floating_point() else t for t in part)
    finally:
        for owner, name, tensor in reversed(replaced):
            setattr(owner, name, tensor)


class GhostClipper:
    """Per-example clipped gradient sum by per-layer rules (ghost norm / materialization) and book-keeping.

    Same interface and arguments as :class:`~lightning_dprobust.core.per_sample.PerExampleClipper`, plus:

    Args:
        on_mismatch: ``"raise"`` (default) raises :class:`EngineMismatch` when a check against the vmap engine
            fails; ``"fallback"`` logs a warning and uses the vmap engine from then on. Applies to a check before which
            no ghost result was released (the first one, and one that follows a fallback's reset).
        on_late_mismatch: a check that fails after ghost results were released since the last passing one:
            ``"raise"`` (default) raises :class:`EngineMismatch`, whatever ``on_mismatch`` says; ``"fallback"`` uses
            the vmap engine from then on and adds the unchecked steps to :attr:`unbounded_calls`.
        check_every: run the check against the vmap engine again every this many calls of two examples or more
            (:data:`CHECK_EVERY`); ``None``: only at the first such call and at steps that add layers or captures.
        probe: at every step of a model without dropout or drop-path, compute the losses of
            :data:`PROBE_EXAMPLES` examples chosen far apart (:func:`check_rows`) alone, without gradients, and compare
            them with their losses in the step's batch; a difference runs the full check on that step before its
            result is returned. A loss term or layer that starts to mix examples' losses is so found at the step it
            starts, not up to ``check_every`` steps later (a mixing that leaves every loss value unchanged and only
            moves gradients still waits for the periodic check). Off by default: on one CPU thread it cost 0.92 ms a
            step on ``cnn_tanh`` at batch 64 (about 20 % of the ghost step; 1.2 ms, about 3 %, at batch 256).
        parameter_names: clip and return only these trainable parameters (default: all), as the vmap engine's
            argument of that name; layers owning none of them are not captured, gradients flow through them.

    Each call runs with autocast off (``Trainer(precision="bf16-mixed")``), and the products that form the norms and
    the clipped sum with TF32 off (CUDA); both restored after. An example's norm and its share of the clipped sum come
    from different products (a Gram product or a materialized gradient, then a reweighted product); bf16 rounds the
    factors of each to 8 mantissa bits and TF32 to 10, so the norm could miss the share's by 0.1 to 1 % and the share
    exceed ``max_grad_norm`` by as much (under ``bf16-mixed`` the first-step check saw norms 0.2 to 0.4 % apart). In
    float32 they agree to rounding. The forward and the backward to the layer outputs keep the caller's TF32 setting
    (cuDNN's default is on, as in non-private training): they form the activations and output gradients that both the
    norm and the share are computed from, so their rounding changes what an example's gradient is, not whether its
    norm is its share's. So do the per-example gradients of the layers that keep them (formed in the backward for
    streamed layers, just after it for the others): each is formed once, and its norm and its share are both taken
    from that one tensor, so rounding cannot part them; a convolution's, batched products, follow cuDNN's TF32
    setting (``core/ghost/conv.py``), as its weight gradient does in non-private training. The first-step check runs
    with TF32 off throughout, as the vmap engine it compares with. The vmap engine keeps autocast: its norms and its
    sum come from the same per-example gradients.
    """

    def __init__(
        self,
        module: nn.Module,
        loss_method: str,
        max_grad_norm: float,
        max_physical_batch_size: int | None = None,
        clipping: str = "flat",
        on_mismatch: str = "raise",
        parameter_names: Collection[str] | None = None,
        check_every: int | None = CHECK_EVERY,
        on_late_mismatch: str = "raise",
        probe: bool = False,
    ) -> None:
        for name, value in (("on_mismatch", on_mismatch), ("on_late_mismatch", on_late_mismatch)):
            if value not in ("raise", "fallback"):
                raise ValueError(f"{name} must be 'raise' or 'fallback', got {value!r}")
        if check_every is not None and (
            isinstance(check_every, bool) or not isinstance(check_every, int) or check_every < 1
        ):
            raise ValueError(f"check_every must be a positive int or None, got {check_every!r}")
        self.check_every = check_every
        self.on_late_mismatch = on_late_mismatch
        self.probe = probe
        self._calls_since_check = 0
        self.unbounded_calls = 0
        """Calls whose ghost results were released and then found, at a later check, not to be comparable with the
        vmap engine's (``on_late_mismatch="fallback"`` only): their sensitivity is unbounded."""
        self._released_unchecked = 0  # ghost results returned since the last passing check
        self.reference = PerExampleClipper(
            module, loss_method, max_grad_norm, max_physical_batch_size, clipping, parameter_names=parameter_names
        )
        self.module, self.loss_method = module, loss_method
        self.max_grad_norm, self.clipping = self.reference.max_grad_norm, clipping
        self.max_physical_batch_size = max_physical_batch_size
        self.on_mismatch = on_mismatch
        self._use_reference = False
        self._warned_global_hooks = False
        self._plan(self.trainable_parameters())

    def _plan(self, trainable: dict[str, Tensor]) -> None:
        """Rules for ``trainable``, the module's trainable parameters as they are now, and everything learned about
        them reset: the next call of two examples or more is checked against the vmap engine again."""
        self._planned = trainable
        self.rules, self.fallback_names = plan_rules(self.module, self.reference.parameter_names)
        self._functional: list[LayerRule] = []  # linear rules whose weight F.linear uses outside the layer's calls
        self._shared_rows: dict[int, set[int]] = {}  # rule -> row counts of its calls on a tensor the batch shares
        self._spread: dict[int, LayerRule] = {}  # the rules of those calls
        self._undecided = {  # composite rules whose parameters the first forward may show captured on the graph
            id(rule): (rule, broadcast_rules(rule.module, rule.names))
            for rule in self.rules
            if isinstance(rule, CompositeRule)
        }
        self._fallback = self._fallback_clipper()
        # under "auto", a parameter without a rule means vmap for every parameter, as when it is found at a step
        self._use_reference = self._use_reference or (self.on_mismatch == "fallback" and bool(self.fallback_names))
        self._verified = False
        self._unchecked: list[str] = []  # what a step after the check added, checked at that step's end
        self._added_names: set[str] = set()  # the parameters of those additions, until a check compares them
        self._used: set[int] = set()  # the rules that have had calls
        self._seen_by_check: set[int] = set()  # the rules that have had calls in a check's forward
        self._delegated: set[int] = set()  # modules whose parameters were handed to an ancestor's re-run, or tried

    def trainable_parameters(self) -> dict[str, Tensor]:
        return self.reference.trainable_parameters()

    def _replanned(self) -> dict[str, Tensor]:
        """The trainable parameters, after planning the rules again where they are not those the rules were planned
        for: a parameter frozen or unfrozen since (Lightning's ``BackboneFinetuning`` unfreezes a backbone
        mid-training), or a module replaced. The rules would otherwise leave an unfrozen parameter's sum at zero (it
        would be trained on noise alone) and count a frozen one's gradient in the norms."""
        trainable = self.trainable_parameters()
        planned = self._planned
        if trainable.keys() != planned.keys() or any(p is not planned[name] for name, p in trainable.items()):
            changed = sorted(trainable.keys() ^ planned.keys()) or "the same names, other tensors"
            log.info("ghost engine: the trainable parameters changed (%s); planning the rules again", changed)
            for rule in self.rules:
                rule.reset()
            self._plan(trainable)
        return trainable

    def _fallback_clipper(self) -> PerExampleClipper | None:
        """The vmap engine restricted to the parameters without a rule (``None`` when every parameter has one)."""
        if not self.fallback_names:
            return None
        names = self.fallback_names
        return PerExampleClipper(
            self.module, self.loss_method, self.max_grad_norm, clipping=self.clipping, parameter_names=names
        )

    def _to_fallback(self, stray: list[LayerRule], reason: str) -> None:
        """Hand the parameters of ``stray`` rules to the vmap engine, for good; ``reason`` says why (for the log)."""
        names = [name for rule in stray for name in rule.names.values()]
        log.warning(
            "ghost engine: %s %s; their per-example gradients now come from the vmap engine (engine='auto': every "
            "parameter's, from the next step on)",
            names,
            reason,
        )
        self._forget(stray)
        self.fallback_names = self.fallback_names + names
        self._fallback = self._fallback_clipper()
        # from the next call on, vmap alone: under "auto" (its fallback's per-example pass costs about as much as
        # vmap for every parameter), or when no rule is left (e.g. every critic layer under a gradient penalty)
        self._use_reference = self._use_reference or self.on_mismatch == "fallback" or not self.rules

    def _forget(self, rules: list[LayerRule]) -> None:
        """Drop ``rules`` from the engine, their captures and bookkeeping with them."""
        for rule in rules:
            rule.reset()
            self._spread.pop(id(rule), None)
            self._shared_rows.pop(id(rule), None)
            self._used.discard(id(rule))
            self._seen_by_check.discard(id(rule))
        self.rules = [rule for rule in self.rules if all(rule is not r for r in rules)]
        self._functional = [rule for rule in self._functional if all(rule is not r for r in rules)]

    def _delegate(self, stray: list[LayerRule], unsplit: list[LayerRule], examples: int) -> bool:
        """Hand the parameters of layers no rule of their own can cover to a :class:`CompositeRule` on their nearest
        ancestor that also holds a layer called on the examples' rows (once per layer); returns whether any was
        handed. Such layers are leaf modules never called (stray with no call) and layers called on rows that are not
        the examples' (a table the batch shares):

        * CoAtNet's and MaxViT's attention (timm ``maxxvit``) reads its relative position bias table through
          ``self.rel_pos.get_bias()``, a method, not a call of the ``rel_pos`` module, and passes it to the fused
          attention as its mask: no hook sees that use;
        * MaxViT-RMLP's bias comes from an MLP called on a coordinate table every window shares.

        Re-running the ancestor per example covers these uses; the graph check then finds every use inside the
        ancestor's calls (or the rule goes to the vmap engine, as any other), and where the handing happens in the
        first step, as for these models, that step's check compares the norms with the vmap engine's. The ancestor
        must be deterministic, hold at most :attr:`CompositeRule.MAX_SHARE` of the model's parameters, and own no rule
        other than a composite one (which then covers both)."""
        uncalled = [rule for rule in stray if type(rule) is MaterializedRule and not rule.calls]
        candidates = [rule for rule in [*uncalled, *unsplit] if id(rule.module) not in self._delegated]
        if not candidates:
            return False
        self._delegated |= {id(rule.module) for rule in candidates}
        chosen = {id(rule) for rule in candidates}
        on_rows = {
            id(rule.module)
            for rule in self.rules
            if id(rule) not in chosen and rule.calls and not any(call.shape[0] % examples for call in rule.calls)
        }
        total = parameter_count(p for p in self.module.parameters() if p.requires_grad)
        handed: dict[int, tuple[nn.Module, dict[str, str], list[LayerRule]]] = {}
        for rule in candidates:
            found = self._reruns_for(rule, on_rows, total)
            if found is not None:
                ancestor, path = found
                entry = handed.setdefault(id(ancestor), (ancestor, {}, []))
                entry[1].update({f"{rule.path[len(path) + 1 :]}.{local}": full for local, full in rule.names.items()})
                entry[2].append(rule)
        for ancestor, names, rules in handed.values():
            owned = [rule for rule in self.rules if rule.module is ancestor]
            self._forget(rules + owned)
            self.rules.append(CompositeRule(ancestor, {k: v for rule in owned for k, v in rule.names.items()} | names))
            log.info("ghost engine: %s re-run per example for %s", type(ancestor).__name__, sorted(names.values()))
        return bool(handed)

    def _reruns_for(self, rule: LayerRule, on_rows: set[int], total: int) -> tuple[nn.Module, str] | None:
        """The nearest ancestor of ``rule``'s module (and its path) that holds a module of ``on_rows`` and that a
        :class:`CompositeRule` can re-run (``total``: the model's trainable parameter count), or ``None``."""
        parts = rule.path.split(".")
        for end in range(len(parts) - 1, 0, -1):
            path = ".".join(parts[:end])
            ancestor = self.module.get_submodule(path)
            if not any(id(sub) in on_rows for sub in ancestor.modules()):
                continue
            owned = [r for r in self.rules if r.module is ancestor]
            if any(type(r) is not CompositeRule for r in owned) or is_stochastic(ancestor):
                return None
            return (ancestor, path) if CompositeRule.small_enough(ancestor, total) else None
        return None

    def describe(self) -> str:
        """One line: how many parameter tensors each rule covers and which ones fall back to vmap."""
        counts: dict[str, int] = {}
        for rule in self.rules:
            counts[type(rule).__name__] = counts.get(type(rule).__name__, 0) + len(rule.names)
        text = ", ".join(f"{name}: {count}" for name, count in sorted(counts.items()))
        return f"{text}; vmap fallback: {self.fallback_names or 'none'}"

    def __call__(self, batch: tuple[Tensor, ...]) -> ClippedSum:
        """Clipped per-example gradient sum of ``batch`` (a tuple of tensors sharing the leading batch dim)."""
        with torch.autocast(batch[0].device.type, enabled=False):
            return self._clipped_sum(batch)

    def _clipped_sum(self, batch: tuple[Tensor, ...]) -> ClippedSum:
        size = batch[0].shape[0]
        trainable = self._replanned()
        if _global_forward_hooks():
            if not self._warned_global_hooks:
                log.warning(GLOBAL_HOOKS)
                self._warned_global_hooks = True
            return self.reference(batch)
        if size == 1 and not self._verified:  # one example cannot show rows laid out otherwise than by example
            return self.reference(batch)
        if size > 1 and self._verified and not self._use_reference and self._check_due():
            self._verified = False  # checked again before this step's result counts (CHECK_EVERY)
        if size and not self._verified:
            self._verify(batch)
        if self._use_reference:
            return self.reference(batch)
        if size == 0:
            empty = batch[0].new_zeros(0)
            return ClippedSum(self._complete({}, trainable), empty, empty)
        chunk = self.max_physical_batch_size or size
        sums: dict[str, Tensor] = {}
        norms, losses = [], []
        for start in range(0, size, chunk):
            part = tuple(t[start : start + chunk] for t in batch)
            part_norms, part_losses, part_sums = self._clipped_part(part)
            for name, g in part_sums.items():  # the first chunk's sums are kept, not copied: one sum in memory
                sums[name] = sums[name].add_(g) if name in sums else g
            norms.append(part_norms)
            losses.append(part_losses)
        result = ClippedSum(self._complete(sums, trainable), torch.cat(norms), torch.cat(losses))
        if self._unchecked:
            return self._checked_again(batch, result)
        if self._probe_mixes(batch, result.losses):
            log.info("ghost engine: the per-step probe found losses that depend on the batch; checking this step")
            self._verify(batch)
            if self._use_reference:
                return self.reference(batch)
        self._released_unchecked += 1
        return result

    def _probe_mixes(self, batch: tuple[Tensor, ...], losses: Tensor) -> bool:
        """Whether the losses of a few far-apart examples computed alone differ from theirs in ``batch`` (``losses``):
        a loss term or layer mixing the examples. Off for models with dropout or drop-path, whose draws differ."""
        if not self.probe or batch[0].shape[0] < 2 or is_stochastic(self.module):
            return False
        rows = check_rows(batch, PROBE_EXAMPLES)
        loss = getattr(self.module, self.loss_method)
        with torch.no_grad():
            alone = torch.cat([loss(*(t[i : i + 1] for t in batch)) for i in rows.tolist()])
        return not torch.allclose(alone, losses[rows].to(alone.dtype), rtol=_PROBE_RTOL, atol=_PROBE_ATOL)

    def _check_due(self) -> bool:
        """Counts this call (of two examples or more); whether the periodic check against the vmap engine is due
        (:data:`CHECK_EVERY`)."""
        self._calls_since_check += 1
        return self.check_every is not None and self._calls_since_check >= self.check_every

    def _added_after_check(self, what: str, names: Collection[str]) -> None:
        """Note that this step's forward added ``what`` (a rule or capture of the parameters ``names``) after the
        first-step check, which never compared it with the vmap engine (a module that reads a table through a method
        only from some step on). Until a check has compared them, their results were never released, so a mismatch
        in them alone is not late (:meth:`_verify`)."""
        if self._verified:
            self._unchecked.append(what)
            self._added_names |= set(names)

    def _checked_again(self, batch: tuple[Tensor, ...], result: ClippedSum) -> ClippedSum:
        """``result``, of a step that added rules or captures after the first-step check, once those have passed the
        same check on this batch (:meth:`_verify`); where the check changes a choice (parameters moved to the vmap
        engine, or the vmap engine alone), the step runs again with that choice. A batch of one example is the vmap
        engine's, and the check waits for the next batch of two examples or more, as at the first step."""
        log.info("ghost engine: checking against the vmap engine what this step added: %s", self._unchecked)
        self._unchecked, self._verified = [], False
        if batch[0].shape[0] == 1:
            return self.reference(batch)
        choices = (self._use_reference, list(self.fallback_names), [id(rule) for rule in self.rules])
        self._verify(batch)
        if choices == (self._use_reference, self.fallback_names, [id(rule) for rule in self.rules]):
            self._released_unchecked += 1
            return result
        return self._clipped_sum(batch)

    @staticmethod
    def _complete(sums: dict[str, Tensor], trainable: dict[str, Tensor]) -> dict[str, Tensor]:
        """``sums`` in the order of the ``trainable`` parameters, zeros for those no layer call reached."""
        return {name: sums[name] if name in sums else torch.zeros_like(p) for name, p in trainable.items()}

    # -------------------------------------------------------------------------------------------- internals
    def _clipped_part(
        self, part: tuple[Tensor, ...], shares: dict[tuple[str, ...], Tensor] | None = None
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Norms, losses and clipped sums of one chunk. The per-example gradients of the layers that keep them and of
        the vmap fallback are one ``[B, P]`` matrix (:func:`example_rows`): one norm and one weighted sum for all of
        them (ResNet-18: 40 GroupNorm tensors and the stem), the other rules give their own norms and sums.
        ``shares``, when given, receives each rule's (or kept gradient's) squared norms, keyed by parameter names."""
        losses = self._output_gradients(part)  # the caller's TF32 setting
        per_example = self._kept_gradients(part[0].shape[0])  # the caller's TF32 setting too (class docstring)
        with float32_products():
            return self._norms_and_sums(part, losses, per_example, shares)

    def _kept_gradients(self, examples: int) -> dict[str, Tensor]:
        """``full name -> [B, *shape]``: the per-example gradients of the layers that keep them, streamed during the
        backward or formed here from their captures, which are dropped."""
        per_example = {}
        for rule in self.rules:
            if rule.calls and rule.keeps_per_example(examples):
                per_example.update({rule.names[k]: g for k, g in rule.per_example_gradients(examples).items()})
                rule.calls = []
        return per_example

    def _norms_and_sums(
        self,
        part: tuple[Tensor, ...],
        losses: Tensor,
        per_example: dict[str, Tensor],
        shares: dict[tuple[str, ...], Tensor] | None = None,
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Norms and clipped sums from the kept per-example gradients ``per_example``, the vmap fallback's and the
        other rules' (a layer the forward did not use has zero gradient)."""
        examples = part[0].shape[0]
        summed = [rule for rule in self.rules if rule.calls]  # the kept layers' calls are gone
        squares = [rule.sq_norms(examples) for rule in summed]
        sq = torch.stack(squares or [losses.new_zeros(examples)]).sum(dim=0)
        if self._fallback is not None:
            per_example.update(self._fallback.per_example_gradients(part)[0])
        if shares is not None:
            shares.update({tuple(rule.names.values()): share for rule, share in zip(summed, squares, strict=True)})
            shares.update({(name,): squared_norms(g) for name, g in per_example.items()})
        rows = example_rows(per_example, examples) if per_example else None
        if rows is not None:
            sq = sq + torch.linalg.vector_norm(rows, dim=1).square().to(sq.dtype)
        norms = sq.sqrt()
        factors = clip_factors(norms, self.max_grad_norm, self.clipping)
        sums = split_rows(factors.to(rows.dtype) @ rows, per_example) if rows is not None else {}
        del rows
        per_example.clear()  # frees them (the caller's dict is this one) before the other layers' sums
        for rule in summed:
            sums.update(rule.clipped_sum(factors))
            rule.calls = []  # frees this layer's activations and output gradients before the next layer's sum
        return norms, losses, sums

    def _output_gradients(self, part: tuple[Tensor, ...]) -> Tensor:
        """Forward with capture hooks, then one backward that computes the gradients at the captured edges only.

        Streamed rules get their calls' output gradients from hooks on the calls' output nodes while the backward
        runs (their per-example gradients are formed there and their captures dropped); the other rules' output
        gradients are returned by the backward and kept for book-keeping.
        """
        examples = part[0].shape[0]
        for rule in self.rules:
            rule.reset()
        try:
            with self._hooks():
                losses = getattr(self.module, self.loss_method)(*part)
        except UnsupportedCall as error:
            if error.rule is None:
                raise
            self._to_fallback([error.rule], f"{UNSUPPORTED} ({error})")
            return self._output_gradients(part)  # the forward again, without that rule's hooks
        if losses.shape != (examples,):
            raise ValueError(f"{self.loss_method} must return one loss per example, got shape {tuple(losses.shape)}")
        self._capture_on_graph(losses)
        unspread = self._spread_shared_calls(losses, examples)
        stray = self._stray_rules(losses)
        unsplit = [
            rule for rule in self.rules if id(rule) in unspread or any(call.shape[0] % examples for call in rule.calls)
        ]
        if self._delegate(stray, unsplit, examples):
            return self._output_gradients(part)  # the forward again, with the new rule's hooks
        if stray:
            self._to_fallback(stray, STRAY)
        unsplit = [rule for rule in unsplit if all(rule is not s for s in stray)]
        if unsplit:
            self._to_fallback(unsplit, UNSPLIT)
        if not self._verified:  # a check's forward
            self._seen_by_check |= {id(rule) for rule in self.rules if rule.calls}
        first = [rule for rule in self.rules if rule.calls and id(rule) not in self._used]
        if first:
            self._used |= {id(rule) for rule in first}
            self._added_after_check(
                f"the first calls of the layers of {[rule.path for rule in first]}",
                [name for rule in first for name in rule.names.values()],
            )
        streamed = streamed_rules(self.rules, examples)
        chosen = {id(rule) for rule in streamed}
        calls = [call for rule in self.rules if id(rule) not in chosen for call in rule.calls]
        with _stream_hooks(streamed, examples):
            grads = torch.autograd.grad(losses.sum(), [call.edge for call in calls], allow_unused=True) if calls else []
        for call, grad in zip(calls, grads, strict=True):
            call.grad = grad.view(call.shape) if grad is not None else call.inputs.new_zeros(call.shape)
            call.check_unchanged()
        return losses.detach()

    def _spread_shared_calls(self, losses: Tensor, examples: int) -> set[int]:
        """Spread the calls of linear and convolution layers on a tensor the batch shares over the repeat that
        follows them (``core/ghost/functional.py``); returns the ids of the rules with such a call left unspread.

        A call is taken as shared when its rows are not a multiple of the examples, or when they number as many as
        a call of the same rule spread at an earlier step (a grid of two rows, spread for a batch of three examples,
        is still shared in a batch of two, where its rows would otherwise pass for the examples')."""
        shared = {
            id(call): rule
            for rule in self.rules
            if isinstance(rule, LinearRule)
            for call in rule.calls
            if call.shape[0] % examples or call.shape[0] in self._shared_rows.get(id(rule), ())
        }
        calls = [call for rule in self.rules for call in rule.calls if id(call) in shared]
        rows = {id(call): call.shape[0] for call in calls}
        spread = {id(call) for call in spread_shared_calls(losses, calls, examples)}
        for call in calls:
            rule = shared[id(call)]
            if id(call) in spread:
                if rows[id(call)] not in self._shared_rows.get(id(rule), ()):
                    self._added_after_check(
                        f"{sorted(rule.names.values())} spread over a repeat of {rows[id(call)]}", rule.names.values()
                    )
                self._shared_rows.setdefault(id(rule), set()).add(rows[id(call)])
                self._spread[id(rule)] = rule
        return {id(shared[id(call)]) for call in calls if id(call) not in spread}

    def _capture_on_graph(self, losses: Tensor) -> None:
        """Capture the uses that no forward hook sees (``core/ghost/functional.py``): the broadcast parameters', the
        ``F.linear`` products of the linear layers found used so at an earlier step, and, on the first forward, the
        uses of the composite rules' parameters (:meth:`_stray_rules` decides which rule keeps them)."""
        candidates = [rule for _, found in self._undecided.values() for rule in found]
        broadcast = [rule for rule in self.rules if isinstance(rule, BroadcastRule)] + candidates
        capture_on_graph(losses, broadcast, self._functional)

    def _stray_rules(self, losses: Tensor) -> list[LayerRule]:
        """The rules whose parameters get gradient outside their captured calls, after two decisions made once.

        * A composite rule whose parameters the first forward's graph captures at every use (a block's ``gamma *
          branch``) gives way to those captures, which cost no re-run of the module; one whose parameters are used
          otherwise too keeps its re-runs.
        * A linear rule whose weight ``F.linear`` uses outside the layer's calls captures those products from then on
          (a graph walk more per step).
        """
        if self._undecided:
            self._decide_composites(losses)
        stray = stray_rules(losses, self.rules)
        known = {id(rule) for rule in self._functional}
        functional = [rule for rule in stray if type(rule) is LinearRule and id(rule) not in known]
        if not functional:
            return stray
        self._functional = self._functional + functional
        names = [name for rule in functional for name in rule.names.values()]
        self._added_after_check(f"captures of F.linear with {names}", names)
        capture_on_graph(losses, [], functional)
        return stray_rules(losses, self.rules)

    def _decide_composites(self, losses: Tensor) -> None:
        """Swap each composite rule for its graph captures where every one of its parameters was captured and none is
        stray with them (see :meth:`_stray_rules`)."""
        swaps = {key: found for key, (rule, found) in self._undecided.items() if found and all(r.calls for r in found)}
        self._undecided = {}
        if not swaps:
            return
        tried = [rule for rule in self.rules if id(rule) not in swaps] + [r for found in swaps.values() for r in found]
        stray = {id(rule) for rule in stray_rules(losses, tried)}
        swapped = {key for key, found in swaps.items() if not any(id(r) in stray for r in found)}
        for rule in self.rules:
            if id(rule) in swapped:
                rule.reset()
        kept = [rule for rule in self.rules if id(rule) not in swapped]
        self.rules = kept + [r for key in swapped for r in swaps[key]]

    @contextlib.contextmanager
    def _hooks(self):
        handles = []
        try:
            for rule in self.rules:
                for target, pre, hook, first in rule.capture_hooks():
                    register = target.register_forward_pre_hook if pre else target.register_forward_hook
                    handles.append(register(_naming(rule, hook), with_kwargs=True, prepend=first))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def _verify(self, batch: tuple[Tensor, ...]) -> None:
        """Compare this engine's norms with the vmap engine's on the first examples, in the model's own modes
        (training mode in a training step), with dropout and drop-path off (:func:`_acts_per_value`).

        The check runs with oneDNN off: its batches of 3 and of 1 example would otherwise compile and cache oneDNN
        kernels for shapes the training steps never use (on ``cnn_tanh`` at batch 64, 3 MB that stayed allocated,
        more than the step's own tensors); where that fails (``torch.func``'s ``vmap`` of ``nn.LSTM`` needs oneDNN),
        with oneDNN as the caller set it. The check tests the algebra and the row layout, not the rounding: a
        mismatch is confirmed in float64 before it counts (:func:`_float64`: float64 copies of the parameters stand
        in for them; the parameters themselves are not touched, so DDP's hooks on them stay). In float32 the two
        engines round apart by more than the tolerance on some models (MobileNetV2 with GroupNorm at random
        initialization: the vmap engine's norm of one example 0.8 % below its float64 value, the ghost engine's
        within 1e-5), and ``auto`` then ran vmap for nothing. The float64 comparison runs only after a float32
        mismatch: the float64 copies hold the parameters' memory twice over, which a float64 check at every first
        step would add (ResNet-18's first step: 162 MB against the non-private step's 68). A model that cannot run in
        float64 keeps the float32 result.

        A mismatch after ghost results were released unchecked is late (:meth:`_late_mismatch`), unless it lies only
        in the parameters of rules and captures added since the last check (never released): those are handled as at
        the first check.
        """
        part = batch
        self._calls_since_check = 0
        stochastic = [m for m in self.module.modules() if m.training and _acts_per_value(m)]
        for m in stochastic:
            m.eval()
        try:
            with float32_products():
                checked = self._checked(part)
                if not checked[0]:
                    try:
                        with _float64(self.module, part) as wide:
                            checked = self._checked(wide)
                    except Exception as error:  # e.g. no float64 on the device: the float32 mismatch stands
                        log.info("ghost engine: the first-step mismatch could not be checked in float64 (%s)", error)
        except (RuntimeError, ValueError) as error:
            raise EngineMismatch(
                "ghost engine: the vmap engine cannot compute this model's per-example gradients in the mode it trains "
                f"in ({type(error).__name__}: {str(error).splitlines()[0][:200]}), so the check cannot compare the "
                "engines: a layer that updates state in its forward (F.batch_norm with running statistics) or mixes "
                "examples cannot be trained privately; use a per-example layer (GroupNorm, LayerNorm)"
            ) from error
        finally:
            for m in stochastic:
                m.train(True)
        self._verified = True
        unseen = [rule for rule in self.rules if id(rule) in self._used and id(rule) not in self._seen_by_check]
        if unseen:
            log.warning(UNSEEN_BY_CHECK, [rule.path for rule in unseen])
            self._seen_by_check |= {id(rule) for rule in unseen}  # warned once
        agrees, differing = checked
        released, self._released_unchecked = self._released_unchecked, 0
        added, self._added_names = self._added_names, set()
        if agrees:
            return
        fresh = not released or (bool(differing) and all(set(names) <= added for names in differing))
        if not fresh:
            self._late_mismatch(released, differing)
            return
        captured = self._captured_on_graph()
        if differing and all(set(names) <= captured.keys() for names in differing):
            moved = {id(captured[name]): captured[name] for names in differing for name in names}
            self._to_fallback(list(moved.values()), UNVERIFIED)
            return
        # no norm values: they are computed from private examples before clipping, and logs are released
        message = (
            f"ghost engine per-example norms (those of {differing[:3]} among them) differ from the vmap engine's by "
            f"more than {_VERIFY_RTOL:g} relative: the loss does not lay out example rows consecutively, a layer "
            "or a loss term mixes examples, a layer sees rows that are not examples' (a parameter broadcast over "
            "tokens), or the model draws randomness in eval mode (e.g. residual noise with noise_at_eval)"
        )
        if self.on_mismatch == "raise":
            raise EngineMismatch(message + "; use engine='vmap'")
        log.warning("%s; using the vmap engine", message)
        self._use_reference = True

    def _late_mismatch(self, released: int, differing: list[list[str]]) -> None:
        """A failed check after ``released`` ghost results went out unchecked: stop (default), or go on with the vmap
        engine and count those calls as unbounded (``on_late_mismatch="fallback"``)."""
        message = LATE_MISMATCH.format(steps=released) + f" (the rules of {differing[:3]} among those that differ)"
        if self.on_late_mismatch == "raise":
            raise EngineMismatch(
                message + ". The run stops; train with engine='vmap' (each example's loss computed alone), or pass "
                "DPCallback(on_late_mismatch='fallback') to go on with epsilon reported as infinite"
            )
        log.warning("%s; using the vmap engine from now on, and counting those steps as unbounded", message)
        self.unbounded_calls += released
        self._use_reference = True

    def _checked(self, part: tuple[Tensor, ...]) -> tuple[bool, list[list[str]]]:
        """``(agree, the rules whose squared norms differ)`` on ``part``, with oneDNN off where the model runs so
        (:meth:`_verify`)."""
        try:
            with _without_onednn():
                passes, reference = self._compared(part)
        except RuntimeError as error:
            log.info("ghost engine: the first-step check runs with oneDNN as set (%s)", error)
            passes, reference = self._compared(part)
        total = torch.stack(list(reference.values())).sum(dim=0)
        agrees, differing = True, []
        for ours, shares in passes:
            differing += [
                list(names)
                for names, share in shares.items()
                if list(names) not in differing
                and not torch.allclose(
                    share,
                    sum(reference[name] for name in names),
                    rtol=2 * _VERIFY_RTOL,
                    atol=_VERIFY_SHARE * total.max(),
                )
            ]
            agrees = agrees and torch.allclose(ours, total.sqrt(), rtol=_VERIFY_RTOL, atol=1e-7)
        return agrees and not differing, differing

    def _compared(self, batch: tuple[Tensor, ...]) -> tuple[Passes, dict[str, Tensor]]:
        """At the examples :func:`check_rows` picks: this engine's norms and each rule's squared norms from two passes,
        and the vmap engine's squared norms of each example alone. The passes:

        * over the picked examples as a batch of their own: a batch size other than the step's shows a layer whose
          rows only coincide with the examples' at that size (a table of 5 rows in a batch of 5);
        * over the whole ``batch``, in the step's chunks: a layer or loss term that mixes the examples shows there
          (a sub-batch of copies of one example looks separable whatever the other examples do)."""
        rows = check_rows(batch, VERIFY_EXAMPLES)
        picked = tuple(t[rows] for t in batch)
        alone: dict[tuple[str, ...], Tensor] = {}
        passes = [(self._clipped_part(picked, alone)[0], alone)]
        chunk = self.max_physical_batch_size or batch[0].shape[0]
        norms, shares = [], {}
        for start in range(0, batch[0].shape[0], chunk):
            part_shares: dict[tuple[str, ...], Tensor] = {}
            norms.append(self._clipped_part(tuple(t[start : start + chunk] for t in batch), part_shares)[0])
            for names, share in part_shares.items():
                shares.setdefault(names, []).append(share)
        passes.append((torch.cat(norms)[rows], {names: torch.cat(parts)[rows] for names, parts in shares.items()}))
        return passes, self._reference_squares(picked)

    def _captured_on_graph(self) -> dict[str, LayerRule]:
        """Full name -> rule, for the parameters whose uses are captured on the graph (broadcast parameters, linear
        weights used by ``F.linear``): captures made where no layer call marks the rows, so that a first-step
        mismatch there sends those parameters to the vmap engine instead of failing the step."""
        rules = [rule for rule in self.rules if isinstance(rule, BroadcastRule)] + self._functional
        rules += list(self._spread.values())
        return {name: rule for rule in rules for name in rule.names.values()}

    def _reference_squares(self, part: tuple[Tensor, ...]) -> dict[str, Tensor]:
        """``name -> [B]``: the vmap engine's squared gradient norms of each parameter, one example at a time, so that
        the check holds one parameter-sized gradient at most (as much as a non-private step), not one per checked
        example."""
        squares: dict[str, list[Tensor]] = {}
        for i in range(part[0].shape[0]):
            for name, g in self.reference.per_example_gradients(tuple(t[i : i + 1] for t in part))[0].items():
                squares.setdefault(name, []).append(squared_norms(g))
        return {name: torch.cat(values) for name, values in squares.items()}
