"""``python -m grow <command> ...`` (what ``torchrun -m grow train ...`` runs)."""

from grow.cli import main

main()
