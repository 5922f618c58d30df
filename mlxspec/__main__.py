"""`python -m mlxspec`: the command line."""

from .cli import main

main()
