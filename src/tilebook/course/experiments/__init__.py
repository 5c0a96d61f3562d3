"""The measurements behind the lessons and the benchmarks, each defined once.

A lesson and ``benchmarks/`` often time the same thing (``tilebook.vector_add``
against ``torch.add`` over sizes, say).  Each such measurement lives here, one
module per kernel, as a function that checks what it times and returns rows
for a :class:`tilebook.course.bench.Record`::

    rows = tilebook.course.experiments.vector_add.sizes(exponents=range(12, 29))

A lesson wraps it in :func:`tilebook.course.bench.record_or_measure` (live on a GPU,
the committed record elsewhere) with settings that fit its time budget;
``benchmarks/<kernel>.py`` calls the same function with more rounds and the
sizes of its targets.  Functions here run on a GPU only: they are called from
``record_or_measure``'s sweep, never on a CPU.

A lesson's reading of what it measured (its tables, claims and sentences made from
data) lives beside its measurements, as functions the lesson calls in one line:
``linear_act.read_fusion``, ``vector_add.read_split``; and for lessons 13 and 14,
which measure little of their own, :mod:`.tuning`, :mod:`.profiling` and
:mod:`.decision`.  These read data in either mode.
"""
