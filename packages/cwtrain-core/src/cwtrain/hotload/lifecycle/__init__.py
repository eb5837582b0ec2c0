"""The hot-load lifecycle: one version's cycle, its run, and the distributed share protocol.

* ``settings`` (:class:`~cwtrain.hotload.lifecycle.settings.HotLoadSettings`: a run's hot-load
  settings, declared once) and ``cadence`` (when a version is FULL, and why);
* ``target`` (one deployment's hot-load calls: listings, the chain check, a create with
  single-flight and readiness handling, what every replica serves);
* ``outcome`` (:class:`~cwtrain.hotload.lifecycle.outcome.VersionPlan` and
  :class:`~cwtrain.hotload.lifecycle.outcome.PublishOutcome`, the one metrics schema) and
  ``served`` (the served-identity file);
* ``shares`` (what crosses between the ranks of a distributed publish and the committing
  process, and the commit), ``rank`` (one rank's side: :class:`~cwtrain.hotload.lifecycle.rank.RankShare`)
  and ``sources`` (what a version is published from: a directory, tensors, two checkpoints,
  the ranks' shares, stored objects);
* ``cycle`` (:class:`~cwtrain.hotload.lifecycle.cycle.VersionCycle`, **the composer**: store →
  create → follow → verify → canary → converge on failure → records, for every entry point);
* ``session`` (:class:`~cwtrain.hotload.lifecycle.session.PublishSession`: a run's versions, one
  after the other, through the composer) and ``protocol`` (the distributed share protocol over a
  transport: a process group's collectives, or a driver's calls on its workers);
* ``ahead`` (:class:`~cwtrain.hotload.lifecycle.ahead.PublishAhead`: one step ahead, a session's
  versions published on a background thread while the trainer trains, and its wait measured).

Imports run down this list; the facade (:mod:`cwtrain.hotload.loader`) sits on top.
"""
