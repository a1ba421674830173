"""``fedcore new``: write a new app directory from a template."""

from __future__ import annotations

from pathlib import Path

import click

# Written out, not imported, so `fedcore new --help` reads no templates; a test holds
# them to fedcore.apps.templates.TEMPLATES and DEFAULT_TEMPLATE.
TEMPLATES = ("numpy", "pytorch", "sklearn")
DEFAULT_TEMPLATE = "numpy"


@click.command()
@click.argument("name")
@click.option(
    "--template",
    "-t",
    type=click.Choice(TEMPLATES),
    default=DEFAULT_TEMPLATE,
    show_default=True,
    help="What the app trains: 'numpy' logistic regression on synthetic data, 'pytorch' "
    "a small MLP on synthetic tensors (the app needs torch), 'sklearn' a "
    "scikit-learn linear classifier on the digits bundled with scikit-learn.",
)
@click.option(
    "--dir",
    "parent",
    type=click.Path(exists=True, file_okay=False, writable=True, path_type=Path),
    default=".",
    show_default=True,
    metavar="PARENT",
    help="Directory to write the app into: it becomes PARENT/NAME, which must not exist.",
)
def new(name: str, template: str, parent: Path) -> None:
    """Write a new app directory, NAME, that `fedcore simulate NAME` runs as it is.

    NAME starts with a letter and holds letters, digits, '-' and '_'; the app's
    Python package is NAME lowercased with '-' made '_'. The directory holds a
    pyproject.toml (the app's two halves, its run config under
    [tool.fedcore.app.config] and its node count under
    [tool.fedcore.app.simulation]) and the package: task.py (model and data),
    client_app.py and server_app.py. Its data is made up or ships with a
    dependency: nothing is downloaded.

    \b
    Examples:
      fedcore new my-app
      fedcore new digits --template sklearn --dir ~/apps
    """
    from fedcore import __version__
    from fedcore.apps.templates import render

    written = render(name, template, parent, fedcore_version=__version__)
    target = written[0]
    click.echo(f"wrote {target}/ ({template} template):")
    for path in written[1:]:
        click.echo(f"  {path.relative_to(target)}")
    shown = str(target) if parent != Path() else name
    click.echo("\nsimulate it on this machine:")
    click.echo(f"  fedcore simulate {shown}")
    click.echo("run it on a link with nodes (--link HOST:PORT, or $FEDCORE_LINK):")
    click.echo(f"  fedcore run {shown} --stream")
