"""``overlapviz serve``: the dashboard server (Panel on Bokeh), on 127.0.0.1 by default, fully offline."""

from __future__ import annotations

import click


@click.command()
@click.argument("dataset", required=False, type=click.Path(file_okay=False, path_type=str))
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to listen on.")
@click.option("--port", default=5006, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free port).")
@click.option("--show/--no-show", default=False, show_default=True, help="Open the page in the system's web browser.")
@click.option("--get", "get_path", metavar="PATH", help="Build the page for PATH once, print it and exit (smoke test; no port stays open).")
def serve(dataset: str | None, address: str, port: int, show: bool, get_path: str | None) -> None:
    """Serve the dashboard for DATASET (the bundled sample traces when omitted).

    Pages: Overview (configuration heatmaps), Timeline, Compare, Residency, Ranks.
    Every resource is served by this server or inlined: the page works with no internet.
    """
    from overlapviz import samples
    from overlapviz.dashboards import app

    try:
        if dataset is None:
            click.echo("No dataset given: opening the bundled sample traces (ingested once into the cache).", err=True)
            dataset = str(samples.sample_dataset(progress=None))
        if get_path is not None:
            status, body = app.get(dataset, get_path)
            click.echo(body)
            if status != 200:
                raise click.ClickException(f"GET {get_path} answered HTTP {status}")
            return
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"overlapviz dashboard for {dataset} at http://{address}:{port}/  (Ctrl-C to stop)", err=True)
    try:
        app.serve(dataset, address=address, port=port, show=show)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # port in use, address not available
        raise click.ClickException(f"cannot listen on {address}:{port}: {exc.strerror or exc}") from None
