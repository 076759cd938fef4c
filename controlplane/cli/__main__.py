"""`python -m controlplane.cli`: the same as `rcp`."""

from controlplane.cli import main

main()
