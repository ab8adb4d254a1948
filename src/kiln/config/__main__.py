"""`python -m kiln.config settings > docs/settings.md` and `python -m kiln.config schema >
workflow/schemas/config.schema.json`: the settings reference and the JSON Schema, both generated from
the section models (tests keep the checked-in files current)."""

import sys

from kiln.config import schema, settings

WHAT = {"settings": settings.markdown_table, "schema": schema.json_schema_text}

if len(sys.argv) != 2 or sys.argv[1] not in WHAT:
    sys.exit(f"usage: python -m kiln.config {{{','.join(WHAT)}}}")
settings.check_table()
sys.stdout.write(WHAT[sys.argv[1]]())
