"""`python -m kiln.config > docs/settings.md`: every setting, the stages it reruns and those that read it
only to run (kiln.config.settings; tests/test_settings.py checks the file is current)."""

import sys

from kiln.config import settings

settings.check_table()
sys.stdout.write(settings.markdown_table())
