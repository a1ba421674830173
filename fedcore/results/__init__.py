"""A run's record on disk: the results directory, and what reads it back (plots).

Every ``fedcore simulate`` leaves one (``results/<UTC time>-<app>-<seed>/`` unless
``--out DIR`` or ``--no-save``): ``run.json`` (what ran, how, when, how it ended),
``metrics.jsonl`` (a line per round), ``log.txt``, ``model.npz`` (the final model,
when ``main`` returns one) and ``summary.png``. :mod:`~fedcore.results.directory`
writes it as the run goes, so a run that dies keeps every round it finished;
:mod:`~fedcore.results.reading` reads it; :mod:`~fedcore.results.plot` draws it.
With ``--track``, :mod:`~fedcore.results.trackers` records the same run in MLflow,
TensorBoard or W&B too.
"""

RESULTS_ENV = "FEDCORE_RESULTS"
"""The environment variable that stands in for ``fedcore simulate --out``. Here, not in
:mod:`~fedcore.results.directory`, so that the CLI and the test plugin read it for free."""
