"""`python -m mlxspec`: the command line."""

from mlxspec.cli.main import main

main()
