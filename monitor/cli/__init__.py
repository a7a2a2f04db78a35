"""The ``monitor`` command line (entry point :func:`monitor.cli.main.main`).

One module per command group, each adding its commands with ``add_parser(subparsers)``::

    main.py        the parser of every group, ``main``, and ``monitor demo``
    common.py      CliError, the Kafka options and settings, ``add_command``
    broker.py      monitor broker, replay, tail
    worldmodel.py  monitor worldmodel build-data|train|eval   (L0)
    probes.py      monitor probes extract|train|eval|serve-embeddings   (L1)
    screen.py      monitor screen, monitor calibrate
    stream.py      monitor stream (the streaming worker)
    rlhealth.py    monitor rlhealth
    dashboards.py  monitor dashboards export|push
    report.py      monitor report
    reviewer.py    monitor reviewer train|serve   (L2 judge)

``monitor serve`` and ``monitor paging`` come from :mod:`monitor.service.cli`. Nothing outside
the CLI imports from this package (tests/test_structure.py checks), and nothing here imports
a heavy library before a command runs.
"""
