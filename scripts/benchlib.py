"""Helpers the benchmark scripts share (importing one benchmark would define its flags)."""
from __future__ import annotations

import os


def replace_section(path: str, name: str, text: str) -> None:
    """Writes `text` between benchmark `name`'s markers in `path`, leaving other sections alone."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    content = open(path, encoding="utf-8").read() if os.path.exists(path) else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in content and end in content:
        content = content[:content.index(begin)] + block + content[content.index(end) + len(end):]
    else:
        content = content.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)
