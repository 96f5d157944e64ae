"""``python -m fastprof`` runs the command line."""

from fastprof.cli.main import main

raise SystemExit(main())
