"""The ``dprobust`` command: ``fit|validate|test`` through LightningCLI, plus the evaluation subcommands.

Imports are lazy: ``dprobust --help``, ``--version`` and ``zoo list`` load neither torch nor Lightning."""

from __future__ import annotations

import errno
import importlib
import sys
import warnings
from collections.abc import Callable, Sequence

USER_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError)
"""Errors caused by a bad configuration or missing, unreadable or misplaced files (``OSError``: a folder where a
file should be, a file where a folder should be, no permission): reported in one line, exit status 2. Lightning's
``MisconfigurationException`` and ``DatasetNotFoundError`` join them once loaded (:func:`user_errors`)."""

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as a shell reports it."""


def user_errors() -> tuple[type[BaseException], ...]:
    """:data:`USER_ERRORS` plus Lightning's and the data modules' error classes when those modules are loaded (a
    command that never imported them cannot raise them)."""
    errors = list(USER_ERRORS)
    for module, name in (
        ("lightning.pytorch.utilities.exceptions", "MisconfigurationException"),
        ("lightning_dprobust.data.base", "DatasetNotFoundError"),
    ):
        if module in sys.modules:
            errors.append(getattr(sys.modules[module], name))
    return tuple(errors)


def run_lightning(args: Sequence[str]) -> None:
    """``fit|validate|test`` through :class:`DProbustCLI`; ``args`` is the whole command line, so LightningCLI's
    warning about ``args`` given next to ``sys.argv`` does not apply."""
    from lightning_dprobust.recipes import DProbustCLI

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        warnings.filterwarnings("ignore", message=".*LeafSpec")  # a deprecation inside Lightning, on every fit
        warnings.filterwarnings("ignore", message=".*no `validation_step`")  # generative modules validate nothing
        DProbustCLI(args=args)


COMMANDS: dict[str, tuple[str, str]] = {
    "certify": ("lightning_dprobust.cli.certify", "certify_command"),
    "attack": ("lightning_dprobust.cli.attack", "attack_command"),
    "audit": ("lightning_dprobust.cli.audit", "audit_command"),
    "zoo": ("lightning_dprobust.cli.zoo", "zoo_command"),
    "synthesize": ("lightning_dprobust.cli.synthesize", "synthesize_command"),
}
"""``dprobust`` subcommands outside LightningCLI (the rest go to ``fit|validate|test``): module and function, each
function taking the arguments after the name. Imported on use, so ``dprobust fit`` does not load the evaluation
stack."""

SUBCOMMANDS = tuple(COMMANDS)


def command(name: str) -> Callable[[Sequence[str]], None]:
    """The function of subcommand ``name``, imported now."""
    module, function = COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def _run_subcommand(name: str, args: Sequence[str]) -> None:
    command(name)(args)


HELP = """usage: dprobust {fit,validate,test,certify,attack,audit,zoo,synthesize} [--help] [--version] ...

Differentially private and adversarially robust models: train, evaluate, audit, and share them.

subcommands:
  fit        train from a config: dprobust fit --config configs/dpsgd/digits.yaml --dp.target_epsilon 1.0
  validate   evaluate a checkpoint on the validation split (same flags as fit, plus --ckpt_path)
  test       evaluate a checkpoint on the test split (same flags as fit, plus --ckpt_path)
  certify    randomized-smoothing certificates (Cohen et al. 2019) of checkpoints or zoo entries
  attack     clean and robust accuracy under adversarial attacks
  audit      membership-inference attacks on a checkpoint, or a one-run canary audit of a training config
  zoo        list, download, inspect and build the pretrained checkpoints
  synthesize synthetic EHRs from an IGAMT or EHR baseline checkpoint, release or zoo entry, as a CSV

Every subcommand spells the same things the same way: --config, --ckpt_path, --data.*, --seed, --out, --overwrite,
--batch_size, --wandb.project/--wandb.entity/--wandb.group. Evaluation outputs go to a new folder per run; nothing
is overwritten without --overwrite.

Run `dprobust SUBCOMMAND --help` for its flags; `dprobust --version` prints the version."""
"""``dprobust --help``: every subcommand (LightningCLI's own help would list only fit/validate/test)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dprobust`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(HELP)
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from lightning_dprobust import __version__

        print(f"dprobust {__version__}")
        return 0
    try:
        if args[0] in SUBCOMMANDS:
            _run_subcommand(args[0], args[1:])
        else:
            run_lightning(args)
    except KeyboardInterrupt as interrupt:
        message = getattr(interrupt, "message", None) or "interrupted (Ctrl-C); results not yet written are lost"
        print(f"dprobust: {message}", file=sys.stderr)
        return INTERRUPTED
    except Exception as error:
        if not isinstance(error, user_errors()):
            raise
        print(f"dprobust: error: {describe(_root_cause(error))}", file=sys.stderr)
        return 2
    return 0


def describe(error: BaseException) -> str:
    """The one-line message of a user error; a misplaced file or folder is said in words."""
    if isinstance(error, IsADirectoryError):
        return f"{error.filename} is a folder, but a file is expected there: put the file in its place"
    if isinstance(error, NotADirectoryError):
        return f"{error.filename} is a file, or lies under one, but a folder is expected there"
    if isinstance(error, PermissionError):
        return f"no permission to access {error.filename}: fix its permissions or choose another path"
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" while writing {error.filename}" if error.filename else ""
        return (
            f"the disk is full ({error.strerror}){where}: free space, or write elsewhere (--trainer.default_root_dir "
            "and the logger's save_dir for fit, --out for the other commands); the checkpoints written before stay "
            "valid (each is written to a temporary file and renamed once complete)"
        )
    return str(error)


def _root_cause(error: BaseException) -> BaseException:
    """The user error itself when jsonargparse wrapped it (a refused class argument) in a report of every type tried."""
    cause = error.__cause__ or error.__context__
    while _raised_in_jsonargparse(error) and isinstance(cause, user_errors()):
        error, cause = cause, cause.__cause__ or cause.__context__
    return error


def _raised_in_jsonargparse(error: BaseException) -> bool:
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    return frame is not None and "jsonargparse" in frame.tb_frame.f_code.co_filename


if __name__ == "__main__":
    raise SystemExit(main())
