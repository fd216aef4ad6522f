"""`python -m tailsieve` runs the command-line interface."""

from tailsieve.cli import main

raise SystemExit(main())
