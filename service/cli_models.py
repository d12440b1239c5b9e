"""`rlvr models …`: pretrained models converted once into the model cache (mount with
``app.add_typer(models_app, name="models")`` in service/cli.py)."""
from __future__ import annotations

import typer

models_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Models in the local cache.")


@models_app.command("pull")
def pull(name: str = typer.Argument(..., help="smollm2-135m"),
         force: bool = typer.Option(False, "--force", help="Convert again even if cached.")) -> None:
    """Convert a packaged pretrained model (offline) into $RLVR_MODELS/NAME; prints its path,
    usable as `model.path` in a job spec."""
    from trainer.models import ModelPullError
    from trainer.models import pull as pull_model

    from .settings import get_settings

    try:
        path = pull_model(name, get_settings().models_dir, log=lambda m: typer.echo(m, err=True), force=force)
    except ModelPullError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(path))


@models_app.command("list")
def list_models() -> None:
    """Known pullable models and whether each is already in the cache."""
    from trainer.models import KNOWN

    from .settings import get_settings

    root = get_settings().models_dir
    for name in sorted(KNOWN):
        cached = (root / name / "config.json").is_file()
        typer.echo(f"{name}\t{'cached at ' + str(root / name) if cached else 'not pulled'}")
