"""`python -m specprobe.settings > docs/settings.md`: the table of every setting."""

from specprobe.settings.model import markdown_table

print(markdown_table(), end="")
