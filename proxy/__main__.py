"""``python -m proxy`` runs the ``tufproxy`` command line."""

from proxy.cli import main

raise SystemExit(main())
