"""``overlapviz serve``: the dashboard server (Panel on Bokeh), on 127.0.0.1 behind a per-launch token, offline."""

from __future__ import annotations

import socket
from pathlib import Path

import click
from click.core import ParameterSource

from overlapviz.cli._dataset import DATASET, check_output
from overlapviz.cli._options import device_option, scheduler_option

TOKEN_ENV = "OVERLAPVIZ_TOKEN"


@click.command()
@click.argument("dataset", required=False, type=DATASET)  # a dataset, or traces read into the cache; one line when neither
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Interface to listen on. Anything but loopback needs --allow-remote.")
@click.option("--port", default=5006, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0: any free port; the banner prints the one it got).")
@click.option("--allow-remote", is_flag=True,
              help="Allow a non-loopback --address (the dashboard is then reachable from other machines).")
@click.option("--allow-http", is_flag=True,
              help="With --allow-remote: allow plain HTTP (token and data cross the network in clear text).")
@click.option("--ssl-certfile", type=click.Path(dir_okay=False, exists=True), help="Serve HTTPS with this certificate (PEM).")
@click.option("--ssl-keyfile", type=click.Path(dir_okay=False, exists=True), help="Private key of --ssl-certfile.")
@click.option("--allow-websocket-origin", "origins", multiple=True, metavar="HOST[:PORT]",
              help="Also accept this host name, as the browser's address bar shows it (a reverse proxy, an SSH "
                   "tunnel with another local port). Repeatable.")  # fmt: skip
@click.option("--token", envvar=TOKEN_ENV, show_envvar=True,
              help="The token to require (16+ URL-safe characters) instead of a new random one. On the command "
                   "line every account on the host sees it (ps): prefer $OVERLAPVIZ_TOKEN.")  # fmt: skip
@click.option("--no-token", is_flag=True, help="Require no token: every account on this host can open the dashboard.")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the URL with its token to this file (mode 0600, removed at exit) instead of printing the token.")
@click.option("--unix-socket", metavar="PATH",
              help="Listen on this unix socket file (mode 0600: only you can connect) instead of TCP; reach it "
                   "through an SSH tunnel (docs/security.md).")  # fmt: skip
@click.option("--show/--no-show", default=False, show_default=True, help="Open the page in the system's web browser.")
@click.option("--get", "get_path", metavar="PATH", help="Build the page for PATH once, print it and exit (smoke test; no port stays open).")
@scheduler_option("Draw the Timeline from a Dask cluster (its kernels stay there) and compute the analyze and explain tables "
                  "on it", local=" for a LocalCluster stopped with the server", after="")
@device_option(uses=": residency, fit and SM budget on every page, as `overlapviz explain --device-name` computes them")
@click.pass_context
def serve(ctx: click.Context, dataset: str | None, address: str, port: int, allow_remote: bool, allow_http: bool,
          ssl_certfile: str | None, ssl_keyfile: str | None, origins: tuple[str, ...], token: str | None, no_token: bool,
          token_file: Path | None, unix_socket: str | None, show: bool, get_path: str | None,
          scheduler: str | None, device_name: str | None) -> None:  # fmt: skip
    """Serve the dashboard for DATASET (the bundled sample traces when omitted): a dataset directory, or
    trace files or directories, ingested into the cache once as `overlapviz analyze TRACES` does.

    Pages: Overview (configuration heatmaps), Timeline, Why late, Collectives, Residency, Compare.
    Every resource is served by this server or inlined: the page works with no internet.
    Only the holder of the printed URL's token gets in (docs/security.md).
    Needs the dashboard extra: pip install 'overlapviz[dashboard]'.
    """
    from overlapviz._extras import require

    require("overlapviz serve")  # before the bundled samples are ingested for a server that cannot start
    from overlapviz.ingest import samples
    from overlapviz.dashboards import app
    from overlapviz.dataset.outdir import display_path

    given = {name for name in ("address", "port", "allow_remote", "allow_http", "ssl_certfile", "ssl_keyfile")
             if ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None)}  # fmt: skip
    if unix_socket is not None and given:
        raise click.UsageError(f"--unix-socket listens on no TCP address: drop {', '.join('--' + g.replace('_', '-') for g in sorted(given))}")
    if (ssl_certfile is None) != (ssl_keyfile is None):
        raise click.UsageError("--ssl-certfile and --ssl-keyfile go together")
    for written_path in (token_file, unix_socket):  # files serve writes: never into the dataset it serves
        if written_path is not None:
            check_output(written_path, *([dataset] if dataset else []))
    if device_name is not None:
        from overlapviz.analysis.residency import device_override
        from overlapviz.dashboards import store

        try:
            device_override(device_name)  # a name no GPU has: said now, not as a notice on every page
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
        store.DEVICE["name"] = device_name
    if scheduler:  # the client (and a cluster it started) lives as long as the command: closed when the server stops
        from overlapviz.dashboards import dask_source

        try:
            ctx.with_resource(dask_source.serving(scheduler))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
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
    if ctx.get_parameter_source("token") == ParameterSource.COMMANDLINE:
        click.echo(f"warning: --token on the command line is visible to every account on this host (ps); use ${TOKEN_ENV}", err=True)

    written: list[Path] = []

    def ready(listening) -> None:
        for line in listening.warnings:
            click.echo(line, err=True)
        url = listening.url
        if token_file is not None and listening.access.token is not None:
            written.append(app.security.write_private(token_file, url + "\n"))
            url = f"{listening.base_url}  (the URL with its token is in {token_file}, readable only by you)"
        if listening.unix_socket is not None:
            click.echo(f"overlapviz dashboard for {display_path(dataset)} on unix socket {listening.unix_socket} (only you can connect). "
                       f"From your machine: ssh -N -L {app.TUNNEL_PORT}:{listening.unix_socket} {socket.getfqdn()} "
                       f"then open {url}  (Ctrl-C to stop)", err=True)  # fmt: skip
        else:
            click.echo(f"overlapviz dashboard for {display_path(dataset)} at {url}  (Ctrl-C to stop)", err=True)

    try:
        app.serve(dataset, show=show, on_ready=ready, address=address, port=port, unix_socket=unix_socket, token=token,
                  no_token=no_token, allow_remote=allow_remote, allow_http=allow_http, allow_websocket_origin=origins,
                  ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile)  # fmt: skip
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # port in use, address not available
        where = unix_socket if unix_socket is not None else f"{address}:{port}"
        raise click.ClickException(f"cannot listen on {where}: {exc.strerror or exc}") from None
    finally:
        for path in written:
            path.unlink(missing_ok=True)
