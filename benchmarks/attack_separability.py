"""How far one example moves the clipped gradient sum when the training attack couples a batch, and when it does not.

DP-SGD's sensitivity bound says removing one example changes the sum of clipped per-example gradients by at most
``C``. With adversarial training the sum is taken at the adversarial views, so the bound holds only if the other
examples' views do not move. For a batch of digits test images and a cnn_tanh trained as in the tests, this prints,
for each attack, the largest ``norm(S(D) - S(D - j)) / C`` over the removed example ``j`` (every run seeded alike), and
the largest move of another example's view (pixel units). Separable attacks stay at or below 1.

Usage: ``python benchmarks/attack_separability.py [--batch 16] [--removed 16]``.
"""

from __future__ import annotations

import argparse

import torch
import torchattacks

from lightning_dprobust.core.per_sample import PerExampleClipper
from lightning_dprobust.methods import DPSGD
from lightning_dprobust.robustness.randomness import isolated_rng, seed_everything_quietly
from lightning_dprobust.robustness.reports import markdown_table
from lightning_dprobust.robustness.separability import PerExampleAttack
from results import add_results_arguments, result_name, write_result
from tests.helpers import trained_digits_classifier

CLIP = 1.0
ATTACKS = {
    "FGSM": lambda m: torchattacks.FGSM(m, eps=0.1),
    "PGD (no random start)": lambda m: torchattacks.PGD(m, eps=0.1, alpha=0.03, steps=5, random_start=False),
    "APGD, batched": lambda m: torchattacks.APGD(m, eps=0.1, steps=5),
    "APGD, one example at a time": lambda m: PerExampleAttack(torchattacks.APGD(m, eps=0.1, steps=5)),
    "CW, batched": lambda m: torchattacks.CW(m, c=1, steps=30, lr=2.0),
    "CW, one example at a time": lambda m: PerExampleAttack(torchattacks.CW(m, c=1, steps=30, lr=2.0)),
}


def views(attack, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    with isolated_rng(), torch.enable_grad():
        seed_everything_quietly(0)
        return attack(x, y).detach()


def clipped_sum(clipper: PerExampleClipper, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.cat([g.flatten() for g in clipper((x, y)).grads.values()])


def measure(module: DPSGD, attack, x: torch.Tensor, y: torch.Tensor, removed: int) -> tuple[float, float]:
    clipper = PerExampleClipper(module, "per_example_loss", max_grad_norm=CLIP)
    full_views = views(attack, x, y)
    full = clipped_sum(clipper, full_views, y)
    sensitivity, moved = 0.0, 0.0
    for j in range(removed):
        keep = torch.arange(len(y)) != j
        kept_views = views(attack, x[keep], y[keep])
        moved = max(moved, (kept_views - full_views[keep]).abs().max().item())
        sensitivity = max(sensitivity, (full - clipped_sum(clipper, kept_views, y[keep])).norm().item() / CLIP)
    return sensitivity, moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="examples in the batch (default: 16)")
    parser.add_argument("--removed", type=int, default=16, help="remove each of the first N examples (default: 16)")
    add_results_arguments(parser)
    args = parser.parse_args()
    model, x, y = trained_digits_classifier()
    for p in model.parameters():
        p.requires_grad_(False)
    module = DPSGD(model=model, num_classes=10, input_shape=(1, 8, 8)).eval()
    for p in module.parameters():
        p.requires_grad_(True)  # the clipper differentiates the parameters; attacks only the inputs
    x, y = x[: args.batch], y[: args.batch]
    rows = []
    for name, build in ATTACKS.items():
        sensitivity, moved = measure(module, build(model), x, y, args.removed)
        rows.append([name, f"{sensitivity:.3f}", f"{moved:.3g}"])
    header = ["training attack", "max norm of S(D) - S(D - j), in C", "max move of another view"]
    print(markdown_table(header, rows))
    write_result(
        result_name(args, "attack_separability"),
        title="How far removing one example moves the clipped gradient sum under each training attack",
        columns=header,
        rows=rows,
        seeds=[0],
        notes=f"one run; batch of {args.batch} digits test images, each of the first {args.removed} removed in turn; "
        f"C = {CLIP}; every attack run seeded alike; separable attacks stay at or below 1",
        directory=args.results_dir,
    )


if __name__ == "__main__":
    main()
