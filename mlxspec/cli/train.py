"""`mlxspec train-heads --kind medusa|eagle` (and `train-medusa`, its Medusa spelling): train draft heads on a frozen
target. Both kinds checkpoint every 50-100 steps, resume from --out, and record the base model's fingerprint."""

from __future__ import annotations

from pathlib import Path

import click

COMMON = [
    click.option("--model", default=None, help="Frozen target [default: embedded target]."),
    click.option("--out", "out_dir", required=True, help="Output directory (resumes from its checkpoint)."),
    click.option(
        "--steps", type=click.IntRange(min=1), default=None, help="[default: 400 medusa, 600 hydra, 2000 eagle]"
    ),
    click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True),
    click.option("--seq-len", type=click.IntRange(min=1), default=256, show_default=True),
    click.option("--lr", type=float, default=1e-3, show_default=True),
    click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True),
]


def data_option(default: str):
    return click.option(
        "--data",
        type=click.Choice(["corpus", "self-distill"]),
        default=default,
        show_default=True,
        help="Stdlib text, or the target's own greedy continuations of it.",
    )


def common_options(function):
    for option in reversed(COMMON):
        function = option(function)
    return function


@click.command("train-heads")
@click.option(
    "--kind",
    type=click.Choice(["medusa", "hydra", "eagle", "eagle3", "dflash"]),
    required=True,
    help="Which drafter to train (hydra: Medusa heads that read the previous token; load them with --medusa).",
)
@common_options
@data_option("self-distill")
@click.option("--heads", type=click.IntRange(1, 16), default=4, show_default=True, help="Medusa, Hydra: heads.")
@click.option("--full-lm-heads", is_flag=True, help="Medusa: give each head its own LM head (more memory).")
@click.option("--unroll", type=click.IntRange(1, 6), default=2, show_default=True, help="EAGLE: depths per step.")
@click.option("--distill-sequences", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--block-size", type=click.IntRange(2, 33), default=8, show_default=True, help="DFlash: rows a block.")
@click.option("--layers", type=click.IntRange(1, 8), default=2, show_default=True, help="DFlash: drafter layers.")
@click.option("--anchors", type=click.IntRange(min=1), default=32, show_default=True, help="DFlash: blocks a window.")
@click.option("--gamma", type=click.FloatRange(min=0.1), default=4.0, show_default=True, help="DFlash: row decay.")
@click.option("--draft-vocab", type=click.IntRange(min=0), default=0, help="EAGLE-3: draft vocabulary [default: V/4].")
@click.option(
    "--sampled-share",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="EAGLE-3, Hydra: share of the self-distilled data sampled at T=0.7 (the rest greedy).",
)
@click.option(
    "--english-share",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="EAGLE-3: share of the self-distilled prompts taken from English text (the rest from code).",
)
@click.option(
    "--target-rows",
    is_flag=True,
    help="EAGLE-3: a hot-vocabulary head whose output layer is the target's own rows of the draft vocabulary "
    "(FR-Spec): not trained, not stored.",
)
def train_heads(kind, **params) -> None:
    """Train Medusa heads, an EAGLE or EAGLE-3 head or a DFlash block drafter on a frozen target."""
    if kind == "medusa":
        _train_medusa(**params)
        return
    if kind == "dflash":
        _train_dflash(**params)
        return
    if kind == "eagle3":
        _train_eagle3(**params)
        return
    if kind == "hydra":
        _train_hydra(**params)
        return
    from mlxspec.drafting.heads.feature_head import CONFIG_FILE
    from mlxspec.train.eagle import EagleTrainConfig, train_eagle

    config = EagleTrainConfig(
        **head_settings(params, 2000), unroll=params["unroll"], distill_sequences=params["distill_sequences"]
    )
    run_training(config, train_eagle, params["model"], params["out_dir"], CONFIG_FILE, "the EAGLE head")


@click.command("train-medusa")
@common_options
@click.option("--heads", type=click.IntRange(1, 16), default=4, show_default=True)
@data_option("corpus")
@click.option("--full-lm-heads", is_flag=True, help="Give each head its own LM head (more memory).")
def train_medusa(**params) -> None:
    """Train Medusa heads on a frozen target (the same as train-heads --kind medusa)."""
    _train_medusa(**params)


def _train_medusa(model, out_dir, steps, batch_size, seq_len, lr, seed, data, heads, full_lm_heads, **_) -> None:
    from mlxspec.drafting.heads.medusa import CONFIG_FILE
    from mlxspec.train.medusa import MedusaTrainConfig
    from mlxspec.train.medusa import train_medusa as run

    config = MedusaTrainConfig(
        num_heads=heads,
        steps=steps or 400,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        seed=seed,
        data=data,
        shared_lm_head=not full_lm_heads,
    )
    run_training(config, run, model, out_dir, CONFIG_FILE, "Medusa heads")


def _train_eagle3(**params) -> None:
    from mlxspec.train.eagle3 import Eagle3TrainConfig, train_eagle3

    config = Eagle3TrainConfig(
        **{**head_settings(params, 2000), "data": "self-distill"},  # EAGLE-3 trains on the target's own text only
        unroll=params["unroll"],
        distill_sequences=params["distill_sequences"],
        draft_vocab=params["draft_vocab"],
        sampled_share=params["sampled_share"],
        english_share=params["english_share"],
        target_rows=params["target_rows"],
    )
    run_training(config, train_eagle3, params["model"], params["out_dir"], "config.json", "the EAGLE-3 head")


def _train_hydra(**params) -> None:
    from mlxspec.drafting.heads.medusa import CONFIG_FILE
    from mlxspec.train.hydra import HydraTrainConfig, train_hydra

    settings = {**head_settings(params, 600), "data": "self-distill"}  # Hydra heads learn the target's own text
    config = HydraTrainConfig(
        **settings,
        num_heads=params["heads"],
        distill_sequences=params["distill_sequences"],
        sampled_share=params["sampled_share"],
    )
    run_training(config, train_hydra, params["model"], params["out_dir"], CONFIG_FILE, "Hydra heads")


def _train_dflash(**params) -> None:
    from mlxspec.train.dflash import DFlashTrainConfig, train_dflash

    config = DFlashTrainConfig(
        **head_settings(params, 1500),
        distill_sequences=params["distill_sequences"],
        block_size=params["block_size"],
        layers=params["layers"],
        anchors=params["anchors"],
        gamma=params["gamma"],
    )
    run_training(config, train_dflash, params["model"], params["out_dir"], "config.json", "the DFlash drafter")


def head_settings(params: dict, default_steps: int) -> dict:
    """The settings every head trainer's config takes from the common options."""
    keys = ("batch_size", "seq_len", "lr", "seed", "data")
    return {"steps": params["steps"] or default_steps, **{key: params[key] for key in keys}}


def run_training(config, train, model: str | None, out_dir: str, config_file: str, what: str) -> None:
    """What every kind shares: check the settings, refuse a bad --out before loading, load the frozen target,
    check the settings against its context, train with progress on stderr, and say where the result went."""
    from mlxspec.loading import DEFAULT_TARGET, load_model, resolve_model_path
    from mlxspec.train.medusa import prepare_out_dir

    config.validate()
    model_dir = resolve_model_path(DEFAULT_TARGET if model is None else model)
    prepare_out_dir(out_dir, config_file, model_dir)
    target = load_model(model_dir)
    config.validate(target.context_length)
    train(target, Path(out_dir), config, log=lambda line: click.echo(line, err=True))
    click.echo(f"saved {what} to {out_dir}")
