"""`python -m release ci`: the GitHub Actions workflow of a release, generated from the manifest.

* ``workflow``: the file as a whole (triggers, render, schema, drift, write);
* ``jobs``: its three jobs (wheels, GPU gates, release);
* ``actions``: the pinned actions and the step builders;
* ``refusals``: what the manifest must hold for every path of the workflow to finish, each
  refusal one line naming the key (docs/ci.md);
* ``replay`` and its ``replay_*`` modules: `ci --replay`, the committed workflow's jobs run on
  this machine with a documented stand-in for each action (docs/ci.md, "Replaying the workflow
  here").

May import: ``release.util``, ``release.errors``, ``release.manifest``, ``release.catalogue``,
``release.records`` (the names of its records), ``release.wheelset``, the
names the workflow must agree with from ``release.builder``, ``release.gates``, ``release.trust``
and ``release.report``. Never imports ``release.steps`` or the CLI: the workflow describes
steps, and the replay runs them as the workflow's own ``run:`` lines, in processes.
"""
