"""Schema of every entry in the shipped catalog ``zoo/entries``, checked on the raw YAML against independent sources.

As torchvision's ``test_schema_meta_validation``: required and permitted keys per status and kind (classifier, DP
classifier, smoothed classifier), ``num_params`` equal to the built model's, ``arch.tag`` names with a registered
arch, the model's normalization equal to its data module's, and every shipped file's SHA-256. Privacy records of
shipped entries are recomputed with Opacus' RDP analysis (an implementation independent of ours).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import math
import re
from pathlib import Path

import pytest
import yaml
from opacus.accountants.analysis import rdp as opacus_rdp

from lightning_dprobust.core.accounting import DEFAULT_ACCOUNTANT, DEFAULT_RDP_ORDERS
from lightning_dprobust.methods.generative_base import GenerativeDPModule
from lightning_dprobust.models import create_model, list_models
from lightning_dprobust.models.timm_models import is_timm_model
from lightning_dprobust.recipes import Recipe
from lightning_dprobust.zoo import Zoo
from lightning_dprobust.zoo.build import recipe_config

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "zoo"
RAW = {path.stem: yaml.safe_load(path.read_text()) for path in sorted((ZOO / "entries").glob("*.yaml"))}
NAMES = sorted(RAW)
REQUIRED = {"name", "status", "url", "file", "sha256", "model", "preprocessing", "meta"}
META_REQUIRED = {"dataset", "num_params", "method", "paper", "metrics", "privacy", "smoothing", "recipe"}
META_PERMITTED = META_REQUIRED | {
    "target_metrics",
    "target_citation",
    "notes",
    "robustness",
    "certification",
    "classifier",
}
PRIVACY = {"epsilon", "delta", "accountant", "noise_multiplier", "max_grad_norm", "sample_rate", "steps"}


GENERATORS = [name for name in NAMES if RAW[name].get("kind") == "generator"]
"""Released EHR synthesizers: tested in tests/zoo/test_zoo_generators.py, and here for what they share."""
NOT_GENERATORS = [name for name in NAMES if name not in GENERATORS]
GENERATOR_RELEASES = {"IGAMT": (2, 1), "EHRVAE": (2, 0)}
"""Private releases per iteration of a generator recipe: every iteration (encoder, decoder), plus one (the joint
critics' step) on the iterations of the critic schedule."""


GENERATIVE_ACCOUNTANT = inspect.signature(GenerativeDPModule).parameters["accountant"].default


def shipped() -> list[str]:
    return [name for name in NAMES if RAW[name]["status"] == "shipped"]


def test_the_catalog_has_the_planned_datasets_and_reads_through_the_api():
    assert {RAW[name]["meta"]["dataset"] for name in NAMES} >= {
        "digits",
        "mnist",
        "fashion_mnist",
        "cifar10",
        "tiny_imagenet",
        "celeba",
        "idc",
    }
    assert [entry.name for entry in Zoo(ZOO).list_entries()] == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_keys_name_and_status(name):
    entry = RAW[name]
    assert set(entry) - {"kind"} == REQUIRED
    assert entry.get("kind", "classifier") in ("classifier", "denoiser", "attack", "generator")
    assert entry["name"] == name
    arch, tag = re.fullmatch(r"([a-z0-9_]+)\.([a-z0-9_]+)", name).groups()
    generator = name in GENERATORS  # its arch names the method; the model is the method's released artifact
    assert generator or arch in list_models() or is_timm_model(arch), f"{arch} is neither registered nor timm"
    assert entry["model"]["name"] in (arch, f"timm/{arch}")
    meta = entry["meta"]
    assert META_REQUIRED <= set(meta) <= META_PERMITTED
    assert entry["status"] in ("shipped", "recipe")
    if entry["status"] == "recipe":
        assert entry["url"] is entry["file"] is entry["sha256"] is None
        assert "target_metrics" in meta and isinstance(meta["target_citation"], str) and meta["target_citation"]
    else:
        assert meta["metrics"] and (generator or all(0.0 <= value <= 1.0 for value in meta["metrics"].values()))
        assert re.fullmatch(r"[0-9a-f]{40}", meta["recipe"]["commit"])


@pytest.mark.parametrize("name", NOT_GENERATORS)
def test_num_params_and_preprocessing_match_the_built_model(name):
    entry = RAW[name]
    model = create_model(entry["model"]["name"], **entry["model"]["kwargs"])
    assert entry["meta"]["num_params"] == sum(p.numel() for p in model.parameters())
    kwargs, preprocessing = entry["model"]["kwargs"], entry["preprocessing"]
    assert preprocessing["input_shape"] == kwargs["input_shape"]
    assert preprocessing["value_range"] == [0.0, 1.0] and preprocessing["normalization"] == "model"
    if entry["model"]["name"] == "residual_perturbation":  # each member normalizes its own (noisy) input
        model, mean, std = model.net.members[0].model, kwargs["member_mean"], kwargs["member_std"]
    else:
        channels = kwargs["input_shape"][0]
        mean, std = kwargs.get("mean", [0.0] * channels), kwargs.get("std", [1.0] * channels)
    assert model.normalize.mean.flatten().tolist() == pytest.approx(mean)
    assert model.normalize.std.flatten().tolist() == pytest.approx(std)


@pytest.mark.parametrize("name", NAMES)
def test_kind_specific_meta(name):
    meta = RAW[name]["meta"]
    if RAW[name].get("kind") in ("denoiser", "attack"):  # names its classifier, an entry of this catalog
        assert meta["classifier"] in NAMES and RAW[meta["classifier"]].get("kind", "classifier") == "classifier"
        assert (meta["smoothing"] is not None) == (RAW[name]["kind"] == "denoiser")
    else:
        assert "classifier" not in meta
    if meta["smoothing"] is not None:
        assert set(meta["smoothing"]) == {"sigma"} and meta["smoothing"]["sigma"] > 0
    privacy = meta["privacy"]
    if privacy is None:
        assert "eps" not in RAW[name]["name"].split(".")[1], "a non-private entry must not carry an epsilon tag"
        return
    if privacy["accountant"] == "nominal":  # a claim, no guarantee (StoBatch, TransDenoiser's top-up)
        assert set(privacy) - {"randomness_mode"} == PRIVACY and privacy["epsilon"] > 0
        assert "nominal" in RAW[name]["meta"]["notes"]
        return
    if privacy["accountant"] == "laplace":  # pure DP (StoBatch): delta 0, no Gaussian mechanism
        assert set(privacy) == PRIVACY and privacy["delta"] == 0 and privacy["epsilon"] > 0
        assert privacy["noise_multiplier"] is privacy["max_grad_norm"] is privacy["sample_rate"] is None
        return
    assert set(privacy) - {"randomness_mode"} == PRIVACY and privacy["accountant"] in ("pld", "rdp", "prv")
    assert 0 < privacy["delta"] < 1e-4 and privacy["max_grad_norm"] > 0
    if RAW[name]["status"] == "shipped":
        assert all(value is not None for value in privacy.values())


@pytest.mark.parametrize("name", [name for name in NOT_GENERATORS if RAW[name]["meta"]["privacy"]] or ["none"])
def test_the_epsilon_tag_is_kept(name):
    if name == "none":
        pytest.skip("no private entry")
    privacy, tag = RAW[name]["meta"]["privacy"], name.split(".")[1]
    digits = re.search(r"_eps(\d+)", tag).group(1)
    target = float(f"0.{digits[1:]}" if digits.startswith("0") else digits)  # eps05 is 0.5, as s025 is sigma 0.25
    if RAW[name]["status"] == "shipped":
        assert 0.95 * target <= privacy["epsilon"] <= 1.005 * target
    elif privacy["epsilon"] is not None:
        assert privacy["epsilon"] == pytest.approx(target, rel=0.05)


@pytest.mark.parametrize("name", shipped() or ["none"])
def test_shipped_weights_match_their_sha256(name):
    if name == "none":
        pytest.skip("no shipped entry")
    entry = RAW[name]
    path = ZOO / entry["url"]
    assert path.name == entry["file"] == f"{name}-{entry['sha256'][:8]}.pth"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]


def test_every_weights_file_belongs_to_an_entry():
    files = {path.name for path in (ZOO / "weights").glob("*")} if (ZOO / "weights").exists() else set()
    assert files <= {RAW[name]["file"] for name in shipped()}


GAUSSIAN = [
    name
    for name in shipped()
    if (RAW[name]["meta"]["privacy"] or {}).get("accountant") not in (None, "laplace", "nominal")
    and RAW[name]["meta"]["method"] != "TransDenoiser"
]
"""Shipped entries with a DP-SGD guarantee at one recorded noise multiplier (a pure-DP Laplace entry or a nominal claim
has no RDP analysis; TransDenoiser's steps each have their own sigma_bar, see the next test)."""


@pytest.mark.parametrize("name", [name for name in shipped() if RAW[name]["meta"]["method"] == "TransDenoiser"])
def test_shipped_transdenoiser_epsilon_is_at_least_the_thesis_claim_and_within_its_budget(name):
    """Each step's noise multiplier is at most xi_up (the recorded noise_multiplier), so the guarantee is at least the
    thesis's epsilon at xi_up for the same steps (Opacus' RDP analysis), and the budget bounds it."""
    privacy = RAW[name]["meta"]["privacy"]
    orders = list(DEFAULT_RDP_ORDERS)
    rdp = opacus_rdp.compute_rdp(
        q=privacy["sample_rate"], noise_multiplier=privacy["noise_multiplier"], steps=privacy["steps"], orders=orders
    )
    nominal, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=privacy["delta"])
    target = Recipe(recipe_config(Zoo(ZOO).info(name))[0]).dp["target_epsilon"]
    assert nominal <= privacy["epsilon"] <= target


@pytest.mark.parametrize("name", GAUSSIAN or ["none"])
def test_shipped_epsilon_matches_opacus_rdp_analysis(name):
    if name == "none":
        pytest.skip("no shipped private entry")
    privacy = RAW[name]["meta"]["privacy"]
    assert privacy["accountant"] == "rdp", "compare other accountants with their own reference"
    orders = list(DEFAULT_RDP_ORDERS)
    rdp = opacus_rdp.compute_rdp(
        q=privacy["sample_rate"], noise_multiplier=privacy["noise_multiplier"], steps=privacy["steps"], orders=orders
    )
    if name in GENERATORS:  # one event per iteration at sigma / sqrt(K), K the private releases of the iteration
        init = recipe_config(Zoo(ZOO).info(name))[0]["model"]["init_args"]
        always, critics = GENERATOR_RELEASES[RAW[name]["meta"]["method"]]
        releases = [
            always + critics * (t % init["critic_freq_base"] < init["critic_freq_hit"]) for t in range(privacy["steps"])
        ]
        rdp = sum(
            opacus_rdp.compute_rdp(
                q=privacy["sample_rate"],
                noise_multiplier=privacy["noise_multiplier"] / math.sqrt(k),
                steps=1,
                orders=orders,
            )
            for k in releases
        )
    epsilon, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=privacy["delta"])
    assert privacy["epsilon"] == pytest.approx(epsilon, rel=1e-4)


def _data_module(config: dict):
    module_path, class_name = config["data"]["class_path"].rsplit(".", 1)
    return getattr(importlib.import_module(module_path), class_name)(**config["data"].get("init_args", {}))


@pytest.mark.parametrize("name", NOT_GENERATORS)
def test_the_recipe_config_builds_the_entry_model_on_its_dataset(name):
    entry = RAW[name]
    path = ROOT / entry["meta"]["recipe"]["config"]
    if not path.is_file():
        assert entry["status"] == "recipe", f"shipped entry {name} lost its recipe config {path}"
        pytest.skip(f"recipe config {path} not written yet (method {entry['meta']['method']})")
    config, _ = recipe_config(Zoo(ZOO).info(name))
    init = config["model"]["init_args"]
    kwargs = entry["model"]["kwargs"]
    denoiser = entry.get("kind") == "denoiser"  # the model is TransDenoiser's denoiser, in front of meta.classifier
    if entry.get("kind") == "attack":  # an AIN generator trained against meta.classifier
        init, kwargs = _ain_view(init, kwargs, entry["meta"]["classifier"])
    if entry["model"]["name"] == "residual_perturbation":
        init, kwargs = _residual_perturbation_view(init, kwargs)
    if entry["model"]["name"] == "stobatch_cnn":
        init = _stobatch_view(init)
    assert init["denoiser" if denoiser else "model"] == entry["model"]["name"]
    if denoiser:
        assert init["classifier"] == entry["meta"]["classifier"]
    extra = {
        k: v
        for k, v in (init.get("denoiser_kwargs" if denoiser else "model_kwargs") or {}).items()
        if k not in ("pretrained", "pretrained_cfg_overlay")
    }
    assert extra == {k: v for k, v in kwargs.items() if k not in ("num_classes", "input_shape", "mean", "std")}
    data = _data_module(config)
    assert data.name == entry["meta"]["dataset"]
    assert (data.num_classes, list(data.input_shape)) == (kwargs["num_classes"], kwargs["input_shape"])
    maps_unit_interval = denoiser or entry.get("kind") == "attack" or entry["model"]["name"] == "stobatch_cnn"
    if not maps_unit_interval:  # denoisers, AINs and StoBatch work on [0, 1] images themselves
        assert list(data.mean) == pytest.approx(kwargs["mean"]) and list(data.std) == pytest.approx(kwargs["std"])
    if entry["meta"]["privacy"] is None:
        assert config.get("dp") is None


def _stobatch_view(init: dict) -> dict:
    """``StoBatch`` always builds the registry's ``stobatch_cnn`` from its ``model_kwargs``."""
    return {"model": "stobatch_cnn", "model_kwargs": init.get("model_kwargs") or {}}


def _ain_view(init: dict, kwargs: dict, classifier: str) -> tuple[dict, dict]:
    """``AIN`` builds ``ain_generator`` from ``generator_kwargs`` and ``noise_std`` against ``target``."""
    assert init["target"] == classifier
    built = dict(init.get("generator_kwargs") or {}, noise_std=init.get("noise_std", 0.1))
    return {"model": "ain_generator", "model_kwargs": built}, kwargs


def _residual_perturbation_view(init: dict, kwargs: dict) -> tuple[dict, dict]:
    """``ResidualPerturbation`` builds the registry's ``residual_perturbation`` ensemble of ``init["model"]`` from its
    own arguments: map the recipe's arguments to the entry's kwargs (``gamma / 2`` input noise for Strategy I)."""
    strategy = init.get("strategy", "additive")
    gamma = init.get("gamma", 0.3)
    noise = (
        init.get("input_noise")
        if init.get("input_noise") is not None
        else (gamma / 2 if strategy == "additive" else 0.0)
    )
    built = {
        "base": init["model"],
        "ensemble_size": init.get("ensemble_size", 1),
        "strategy": strategy,
        "gamma": gamma,
        "input_noise": noise,
        "member_mean": kwargs["member_mean"],
        "member_std": kwargs["member_std"],
    }
    view = dict(kwargs, mean=kwargs["member_mean"], std=kwargs["member_std"])
    return {"model": "residual_perturbation", "model_kwargs": built}, view


def test_published_reference_values():
    """Parameter counts known independently of our code: Bu et al.'s 26,010 for the MNIST tanh CNN and the closed
    form of a two-hidden-layer MLP."""
    by_setup = {
        (RAW[n]["model"]["name"], tuple(RAW[n]["model"]["kwargs"]["input_shape"])): RAW[n] for n in NOT_GENERATORS
    }
    assert by_setup[("cnn_tanh", (1, 28, 28))]["meta"]["num_params"] == 26_010
    for entry in RAW.values():
        if entry["model"]["name"] == "mlp_tanh":
            kwargs = entry["model"]["kwargs"]
            d, h, k = math.prod(kwargs["input_shape"]), kwargs.get("hidden", 128), kwargs["num_classes"]
            assert entry["meta"]["num_params"] == (d + 1) * h + (h + 1) * h + (h + 1) * k


@pytest.mark.parametrize("name", NAMES)
def test_the_recipe_config_matches_the_recorded_privacy_and_smoothing(name):
    entry = RAW[name]
    if not (ROOT / entry["meta"]["recipe"]["config"]).is_file():
        pytest.skip("recipe config not written yet")
    config, _ = recipe_config(Zoo(ZOO).info(name))
    assert not any(c["class_path"].endswith(".DPCallback") for c in config["trainer"].get("callbacks", []))
    privacy = entry["meta"]["privacy"]
    if entry["meta"]["method"] == "StoBatch":  # a nominal epsilon from the module's own ledger, no dp group
        assert config.get("dp") is None and privacy["accountant"] == "nominal"
        assert privacy["epsilon"] == pytest.approx(config["model"]["init_args"]["epsilon"], rel=1e-9)
        return
    if name in GENERATORS:  # a generative module holds its own DP arguments
        args = config["model"]["init_args"] if config["model"]["init_args"].get("noise_multiplier") else None
    else:
        args = Recipe(config).dp if config.get("dp") is not None else None
    assert (args is not None) == (privacy is not None)
    if privacy is not None:
        assert privacy["delta"] == args["delta"] and privacy["max_grad_norm"] == args["max_grad_norm"]
        default = GENERATIVE_ACCOUNTANT if name in GENERATORS else DEFAULT_ACCOUNTANT
        accountant = args.get("accountant", default)
        top_up = entry["meta"]["method"] == "TransDenoiser" and args.get("mode", "transdenoiser") == "transdenoiser"
        if top_up and privacy["epsilon"] is not None:
            accountant = "nominal"  # the top-up's noise scale is chosen from the private batch: no guarantee
        assert privacy["accountant"] == accountant
        if args.get("noise_multiplier", args.get("xi_up")) is not None:  # TransDenoiser records xi_up per step
            assert privacy["noise_multiplier"] == args.get("noise_multiplier", args.get("xi_up"))
        if args.get("target_epsilon") is not None and privacy["epsilon"] is not None:
            assert privacy["epsilon"] <= args["target_epsilon"] * 1.005
            assert privacy["epsilon"] >= (0.95 if entry["status"] == "shipped" else 1.0) * args["target_epsilon"]
    smoothing = entry["meta"]["smoothing"]
    if smoothing is not None:
        assert config["model"]["init_args"]["sigma"] == smoothing["sigma"]
