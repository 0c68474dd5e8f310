"""Prints each ```bash block of README.md's "## Quick start" section on one line (the commands
are single logical lines; line continuations are joined)."""

import re
import sys
from pathlib import Path

text = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
m = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
if not m:
    sys.exit("README.md has no '## Quick start' section")
for block in re.findall(r"^```bash\n(.*?)^```", m.group(1), flags=re.S | re.M):
    print(block.replace("\\\n", " ").strip().replace("\n", " && "))
