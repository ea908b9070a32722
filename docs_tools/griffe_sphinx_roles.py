"""A griffe extension for the documentation site (``mkdocs.yml``): meshio's
docstrings cross-reference with Sphinx roles (``:class:`~meshio.ActorError```),
which Markdown would show as they are typed. Each role becomes inline code,
linked to its entry in the API reference when there is one (an optional
``autoref``: a name the reference does not document stays plain code); a
reST literal block's ``::`` becomes ``:`` (the indented block after it is
already a Markdown code block)."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|exc|data|mod|obj):`(?P<short>~?)"
                  r"(?P<target>[\w.]+)(?P<call>\(\))?`")
LITERAL = re.compile(r"(?<=\S)::(?=\n\s*\n)")


def _identifier(target: str, obj: griffe.Object) -> str:
    """The dotted path a role names: absolute as written, or relative to the
    module of the documented object (Sphinx's lookup for a bare name)."""
    if target.startswith("meshio.") or target == "meshio":
        return target
    return f"{obj.module.path}.{target.lstrip('.')}"


def convert(text: str, obj: griffe.Object) -> str:
    """``text`` with each Sphinx role replaced by an optional autoref."""
    def replace(m: re.Match[str]) -> str:
        target = m["target"]
        shown = (target.rsplit(".", 1)[-1] if m["short"] else target) + (m["call"] or "")
        return (f'<autoref identifier="{_identifier(target, obj)}" optional>'
                f"<code>{shown}</code></autoref>")
    return LITERAL.sub(":", ROLE.sub(replace, text))


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value, obj)
