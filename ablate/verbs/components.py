"""`ablate components`: what is registered, or one component's recipe options, typed."""

from __future__ import annotations

from typing import Any

from ablate.core.errors import UserError


def components(kind: str | None = None, imports: list[str] | None = None, options: str | None = None) -> int:
    """List registered components, or one component's recipe options.

    Args:
        kind: only this kind (attention, norm, lambda_init, ffn, position, task, probe)
        imports: plugin modules to import first
        options: show this component's options (type, default, help); also spelled `--help NAME`
    """
    from ablate.core import registry
    from ablate.core.config import describe
    from ablate.core.tables import markdown_table

    registry.load_plugins(imports or [])
    if options is not None:
        if kind is None:  # the kind whose registry holds that name
            kinds = [e.kind for e in registry.entries() if e.name == options]
            if len(kinds) != 1:
                raise UserError(
                    f"--kind: give the kind of {options!r} "
                    f"({'it is registered under ' + ', '.join(kinds) if kinds else 'no kind registers it'})"
                )
            kind = kinds[0]
        cls = registry.get(kind, options, key="--options")
        rows = [
            [
                o.name,
                describe(o.hint) if o.hint is not Any else "any",
                "(required)" if o.required else repr(o.default),
                o.help,
            ]
            for o in registry.options_of(cls)
        ]
        print(f"{kind} {options}: {registry.Entry(kind, options, cls).description}")
        print(markdown_table(["option", "type", "default", "help"], rows))
        return 0
    rows = [[e.kind, e.name, e.class_path, e.description] for e in registry.entries(kind)]
    print(markdown_table(["kind", "name", "class", "description"], rows))
    return 0


components.help_option = "options"  # `ablate components --help NAME`: that component's options
