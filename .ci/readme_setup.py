"""Print the shell commands of README.md's "Set up" section, one per line.

``.ci/run`` runs exactly these, so the README's install steps are what CI
proves.
"""

from __future__ import annotations

import sys


def setup_commands(readme: str) -> list[str]:
    commands: list[str] = []
    in_section = in_block = False
    for line in readme.splitlines():
        if line.startswith("## "):
            in_section = line.strip() == "## Set up" or line.startswith("## Set up ")
            continue
        if not in_section:
            continue
        if line.strip().startswith("```"):
            in_block = not in_block and line.strip() == "```bash"
            continue
        if in_block and line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
    return commands


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        print("\n".join(setup_commands(f.read())))
