"""Checks, at each optimizer step, that the gradient about to be applied is exactly the private one.

The check runs inside the optimizer's ``step`` itself (:func:`guard_optimizer_step`), after the closure that Lightning
hands it has returned: that closure runs the training step, the backward, every ``on_before_optimizer_step`` hook
(callbacks and module) and ``configure_gradient_clipping``, and the precision plugin's wrapping, so nothing that can
touch ``.grad`` before the update runs after the check. It covers every tensor in ``optimizer.param_groups``, not only
the module's trainable parameters (docs/design.md, contract 10).

How the private gradient reaches ``.grad`` (:meth:`PrivateStepGuard.release`):

- **hand-over** (one process): the training step's loss is a constant with no path to the parameters; at the check,
  every parameter's ``.grad`` must still be ``None`` (nothing else produced a gradient), and the guard then sets it to
  the private gradient. Nothing runs between that assignment and the update, so the applied gradient is the private
  one by construction, at the cost of a pass over the parameter list (no product, no comparison of values). Hooks that
  run before the update (``on_after_backward``, ``on_before_optimizer_step``) see ``.grad = None``; from the update on
  (``on_train_batch_end``) ``.grad`` is the applied private gradient.
- **surrogate** (DDP): the loss is :func:`gradient_surrogate`, whose backward writes the private gradient into
  ``.grad`` through autograd, so DDP's hooks all-reduce it; the check then compares every value of ``.grad`` with
  the private gradient (after the same averaging).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor

Reduce = Callable[[Tensor], Tensor]
"""Averages a tensor over the data-parallel ranks (identity in a single process)."""


class PrivateStepBypassed(RuntimeError):
    """The optimizer was about to apply a gradient that ``DPCallback.private_step`` did not produce."""


class ClosureReplayed(PrivateStepBypassed):
    """The optimizer called its closure a second time in one step (LBFGS, line searches): each call would be another
    private release on the same sampled batch, which the accountant does not count."""


class PrivateStepGuard:
    """Holds the private gradient of the current step and verifies it is what the optimizer will apply.

    Guarantee:
        :meth:`verify` passes only if exactly one private step ran since the last optimizer step, and when it passes
        every trainable parameter's ``.grad`` is the gradient that step produced: after a hand-over
        (:meth:`release` with ``hand_over=True``) it is that very tensor, set by :meth:`verify` once no other gradient
        was found in ``.grad``; after a surrogate it equals it bit for bit in a single process and, under DDP, up to
        the rounding of the all-reduce (relative ``1e-5``), after averaging the ranks' private gradients the way DDP
        averages ``.grad``. A loss that skips ``private_step`` (``per_example_loss(...).mean()``), adds a term that
        reaches the parameters, or calls it twice, and a hook that writes ``.grad``, are therefore stopped before
        their gradient reaches the parameters.

    Assumptions:
        :meth:`verify` runs where nothing can change ``.grad`` before the update: inside the optimizer's step, after its
        closure (:func:`guard_optimizer_step`).
    """

    def __init__(self) -> None:
        self._expected: dict[str, Tensor] | None = None
        self._count = 0
        self._hand_over = False

    def reset(self) -> None:
        """Forget the pending step (at each batch start: a skipped optimizer step releases nothing)."""
        self._expected, self._count, self._hand_over = None, 0, False

    def record(self, expected: dict[str, Tensor], hand_over: bool = False) -> None:
        """Register the private gradient ``name -> tensor`` of one private step; ``hand_over``: :meth:`verify` sets
        ``.grad`` to it instead of comparing (see :meth:`release`)."""
        self._expected = expected
        self._count += 1
        self._hand_over = hand_over

    def release(self, parameters: Mapping[str, Tensor], private: dict[str, Tensor], hand_over: bool) -> Tensor:
        """Register ``private`` and return the loss the training step returns for it.

        ``hand_over=True`` (one process): a zero constant that needs a gradient but reaches no parameter, so the
        backward writes nothing into ``.grad``; :meth:`verify` puts ``private`` there after the closure.
        ``hand_over=False`` (DDP, whose all-reduce runs in the backward of the parameters): :func:`gradient_surrogate`.
        """
        if not private:
            raise ValueError("a private step needs at least one trainable parameter")
        self.record(private, hand_over)
        if not hand_over:
            return gradient_surrogate(parameters, private)
        some = next(iter(private.values()))
        return torch.zeros((), dtype=some.dtype, device=some.device, requires_grad=True)

    @property
    def pending(self) -> bool:
        """Whether a private step was recorded and no optimizer step has verified it yet."""
        return self._count > 0

    def verify_optimizer(
        self, optimizer: torch.optim.Optimizer, parameters: Mapping[str, Tensor], reduce: Reduce | None = None
    ) -> None:
        """:meth:`verify` for the step ``optimizer`` is about to take: every tensor in its ``param_groups`` must be
        one of ``parameters`` (the private step's, ``name -> tensor``) or a frozen tensor with no gradient, which
        optimizers skip; anything else (a ``requires_grad`` buffer, another module's parameter) would be updated
        outside the private step, and stops the run."""
        covered = {id(p) for p in parameters.values()}
        for tensor in _optimized_tensors(optimizer):
            if id(tensor) not in covered and (tensor.requires_grad or tensor.grad is not None):
                self.reset()
                raise PrivateStepBypassed(
                    f"DPCallback: the optimizer updates a tensor of shape {tuple(tensor.shape)} that is not a "
                    "trainable parameter of the module, so the private step does not cover it (its gradient would be "
                    "applied without clipping or noise); optimize only `self.parameters()` of the LightningModule"
                )
        self.verify(parameters, reduce)

    def verify(self, parameters: Mapping[str, Tensor], reduce: Reduce | None = None) -> None:
        """Raise :class:`PrivateStepBypassed` unless ``parameters``' gradients are exactly the recorded ones."""
        count, expected, hand_over = self._count, self._expected, self._hand_over
        self.reset()
        if count != 1 or expected is None:
            raise PrivateStepBypassed(
                f"DPCallback: this optimizer step follows {count} private steps, not exactly one: "
                + (
                    "the loss was computed without private_step, so no clipping or noise was applied; "
                    if not count
                    else ""
                )
                + "training_step must return `self.private_step(inputs)` once and unchanged (the methods' default)"
            )
        if set(parameters) != set(expected):
            raise PrivateStepBypassed(
                "DPCallback: the trainable parameters changed during the step (requires_grad toggled); freeze "
                "parameters before fit"
            )
        names = list(expected)
        if hand_over:  # one process: nothing to average
            _hand_over(parameters, expected)
            return
        if reduce is None:
            differs = [torch.ne(_grad(parameters[name]), expected[name]).any() for name in names]
            matches = not torch.stack(differs).any().item()  # one device sync for all parameters
        else:
            want = reduce(torch.cat([expected[name].flatten() for name in names]))
            have = torch.cat([_grad(parameters[name]).flatten() for name in names])
            matches = torch.allclose(have, want, rtol=1e-5, atol=1e-7)
        if not matches:
            raise PrivateStepBypassed(
                "DPCallback: the gradient about to be applied is not the private gradient: something was added to "
                "the loss returned by private_step, or a hook changed .grad; return `self.private_step(inputs)` "
                "unchanged and put other terms into per_example_loss"
            )


def _hand_over(parameters: Mapping[str, Tensor], private: Mapping[str, Tensor]) -> None:
    """Set each parameter's ``.grad`` to its private gradient; refuse if any ``.grad`` already holds a gradient, which
    then came from outside the private step."""
    written = [name for name, tensor in private.items() if parameters[name].grad is not None]
    if written:
        raise PrivateStepBypassed(
            f"DPCallback: the gradient about to be applied is not the private gradient: {written[:3]} received a "
            "gradient outside private_step (a term added to the loss it returned, or a hook that wrote .grad); return "
            "`self.private_step(inputs)` unchanged, put other terms into per_example_loss, and leave .grad to "
            "DPCallback (it holds the private gradient from the optimizer step on)"
        )
    for name, tensor in private.items():
        parameters[name].grad = tensor


def guard_optimizer_step(optimizer: torch.optim.Optimizer, verify: Callable[[], None]) -> Callable[[], None]:
    """Make ``optimizer.step(closure)`` call ``verify()`` right after its closure returns, before the update; returns
    the function that removes the wrapper.

    A second call of the closure within one step raises :class:`ClosureReplayed` before it runs (so before it
    releases anything): optimizers that re-evaluate the loss (``torch.optim.LBFGS``) would make several private
    releases on one sampled batch. A step without a closure raises :class:`PrivateStepBypassed` (Lightning's
    automatic optimization always passes one)."""
    original = optimizer.step

    def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        if closure is None:
            raise PrivateStepBypassed(
                "DPCallback: optimizer.step() was called without a closure, outside Lightning's automatic "
                "optimization, so the private gradient cannot be verified before the update"
            )
        calls = 0

        def verified_closure() -> Any:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise ClosureReplayed(
                    f"DPCallback: {type(optimizer).__name__} called its closure a second time in one step; every "
                    "call is a private release on the same batch, which the accountant would count as a new batch. "
                    "Use an optimizer that evaluates the loss once per step (SGD, Adam, AdamW, ...)"
                )
            result = closure()
            verify()
            return result

        return original(closure=verified_closure, **kwargs)

    optimizer.step = step

    def remove() -> None:
        if vars(optimizer).get("step") is step:
            del optimizer.step

    return remove


def gradient_surrogate(parameters: Mapping[str, Tensor], gradients: Mapping[str, Tensor]) -> Tensor:
    """The loss ``sum_p <p, g_p>`` (``g_p = gradients[name]``, detached): its backward gives each parameter
    ``parameters[name]`` the gradient ``g_p`` times the incoming gradient (``loss.backward()``: 1, so ``.grad`` is
    ``g_p`` bit for bit, in a tensor of its own), and DDP's hooks on the parameters see it as any gradient.

    This is how a private step hands its gradient to Lightning's optimizer loop. A custom autograd function whose
    backward returns the gradients directly, with no forward products, was tried: 18.2 against 22.8 ms for ResNet-18's
    parameters in isolation (one CPU thread), but 1.04x [1.01-1.15] of this surrogate's time in whole Lightning steps
    (4 alternated fits each, batch 64), so it was not adopted."""
    if not gradients:
        raise ValueError("a private step needs at least one trainable parameter")
    return sum((parameters[name] * grad).sum() for name, grad in gradients.items())


def _same_values(a: Tensor, b: Tensor) -> bool:
    """Same shape and values, NaN equal to NaN (a buffer may hold NaN from its start)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a, b) or (a.is_floating_point() and bool(torch.isclose(a, b, 0, 0, equal_nan=True).all()))


def _optimized_tensors(optimizer: torch.optim.Optimizer) -> Iterator[Tensor]:
    for group in optimizer.param_groups:
        yield from group["params"]


def _grad(parameter: Tensor) -> Tensor:
    return parameter.grad if parameter.grad is not None else torch.zeros_like(parameter)


class BuffersWritten(PrivateStepBypassed):
    """A buffer of the module changed during a training step: a value computed from private examples (running
    statistics) that no clipping or noise covers, released with the ``state_dict``."""


class BufferWatch:
    """Holds the module's buffers as they were at the start of a training step, to verify that the step changed none.

    Guarantee:
        :meth:`verify` passes only if every buffer is the same tensor, of the same shape, holding the same values, as
        at :meth:`snapshot` (compared by value, so writes through ``.data`` count too), and no buffer was added or
        removed. On failure the snapshot's values are written back before the error is raised (:meth:`restore`), so a
        checkpoint saved afterwards does not hold them.

    Cost: one copy of the buffers per step; models trained privately rarely hold more than a normalization's constants.
    """

    def __init__(self) -> None:
        self._module: torch.nn.Module | None = None
        self._saved: dict[str, tuple[Tensor, Tensor]] = {}

    def snapshot(self, module: torch.nn.Module) -> None:
        self._module = module
        self._saved = {name: (buffer, buffer.detach().clone()) for name, buffer in module.named_buffers()}

    def changed(self) -> list[str]:
        """Names of the buffers that differ from the snapshot (added and removed ones included)."""
        if self._module is None:
            return []
        now = dict(self._module.named_buffers())
        names = sorted(now.keys() ^ self._saved.keys())
        for name, (buffer, values) in self._saved.items():
            current = now.get(name)
            if current is not None and not (current is buffer and _same_values(current, values)):
                names.append(name)
        return names

    def verify(self) -> None:
        names = self.changed()
        if names:
            self.restore()
            raise BuffersWritten(
                f"DPCallback: the training step changed the buffers {names[:5]} of the module (e.g. running "
                "statistics of F.batch_norm or a custom layer): their values come from the private batch without "
                "clipping or noise and would be released with the weights. Use a layer without running statistics "
                "(GroupNorm, LayerNorm, or track_running_stats=False)"
            )

    def restore(self) -> None:
        """Write the snapshot's values back into the buffers still held by the module."""
        if self._module is None:
            return
        now = dict(self._module.named_buffers())
        for name, (buffer, values) in self._saved.items():
            if now.get(name) is not buffer:
                path, _, attr = name.rpartition(".")
                owner = self._module.get_submodule(path)
                if attr in owner._buffers:
                    owner._buffers[attr] = buffer
                else:
                    owner.register_buffer(attr, buffer)
            buffer.data = values  # the snapshot's own copy, whatever the buffer's shape became
        self._saved = {name: (buffer, buffer.detach().clone()) for name, (buffer, _) in self._saved.items()}
