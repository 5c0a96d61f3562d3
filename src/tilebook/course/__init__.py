"""The course's tooling: what the lessons, the benchmarks and the site's build use.

:mod:`tilebook` is the library (the runtime, the input checks, the ops) and never
imports this subpackage; a lesson imports each tool by name::

    from tilebook.course.bench import record_or_measure
    from tilebook.course.claims import Claims, speedup
    from tilebook.course.prose import say

Its modules: :mod:`~tilebook.course.aot` and :mod:`~tilebook.course.passes` compile
kernels ahead of time and stage by stage; :mod:`~tilebook.course.bench`,
:mod:`~tilebook.course.experiments` and ``records/`` (the committed GPU measurements,
a folder per GPU kind) measure; :mod:`~tilebook.course.claims`,
:mod:`~tilebook.course.prose`, :mod:`~tilebook.course.tables`,
:mod:`~tilebook.course.plots` and :mod:`~tilebook.course.datasheet` turn data into
the page; :mod:`~tilebook.course.check`, :mod:`~tilebook.course.exercises`,
:mod:`~tilebook.course.display` and the ``widgets*`` modules face the reader.
Importing this package imports none of them.
"""
