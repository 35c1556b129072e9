"""``python -m proxy`` runs the ``tufproxy`` command line."""

from proxy.cli import main

# Guarded: a spawned worker process (PEP 740 verification) imports this module again as __mp_main__.
if __name__ == "__main__":
    raise SystemExit(main())
