"""``fedcore plot``: each metric of one or more runs over rounds, as a picture or in text."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument(
    "runs", nargs=-1, required=True, type=click.Path(file_okay=False, exists=True, path_type=Path)
)
@click.option(
    "--metric",
    "-m",
    "metrics",
    multiple=True,
    metavar="NAME",
    help="A metric to draw: a key (accuracy: in every scope that has it) or scope.key "
    "(server.accuracy, evaluate.loss, train.loss). May be repeated. Default: every "
    "metric, up to six.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The picture to write; its suffix picks the format (.png, .svg, .pdf). "
    "Default: plot.png here.",
)
@click.option(
    "--terminal", is_flag=True, help="Draw in the terminal instead (also without matplotlib)."
)
def plot(
    runs: tuple[Path, ...], metrics: tuple[str, ...], output: Path | None, terminal: bool
) -> None:
    """Draw each metric of the RUNS (results directories) over rounds, on one figure.

    Runs are labelled by what differs between them: seed, backend, nodes, run-config
    values. Pictures need matplotlib (pip install 'fedcore[plots]'); without it, and
    with --terminal, the charts are drawn as text.

    \b
    Examples:
      fedcore plot results/*
      fedcore plot results/a results/b --metric accuracy -o accuracy.png
      fedcore plot results/a --terminal
    """
    from fedcore.results.plot import chosen_metrics, plotting_available, save_figure, terminal_plot
    from fedcore.results.reading import read_run

    read = [read_run(path) for path in runs]
    names = chosen_metrics(read, metrics)
    if not names:
        raise click.ClickException("the runs recorded no metrics to draw")
    if terminal or (output is None and not plotting_available()):
        if not terminal:
            click.echo("(matplotlib is not installed: a text chart instead)", err=True)
        click.echo(terminal_plot(read, names))
        return
    written = save_figure(read, names, output or Path("plot.png"))
    click.echo(f"wrote {written}")
