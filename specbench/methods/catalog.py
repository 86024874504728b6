"""`specbench strategies`: every strategy with its knobs (default, unit, valid and searched range, meaning),
every controller and the knobs of how a combination combines, from what the method modules declare."""

from __future__ import annotations

import importlib
from typing import Any

from rich.console import Group
from rich.text import Text

from specbench.core.markdown import markdown_table
from specbench.methods.combine_options import COMBINE, CombineOptions
from specbench.methods.combine_options import SPACE as COMBINE_SPACE
from specbench.methods.controllers import CONTROLLERS
from specbench.methods.names import BASELINE, COMBINATIONS
from specbench.methods.registry import MODULES, definitions
from specbench.methods.search_space import knob_infos


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _summary(name: str) -> str:
    """The first line of the method module's docstring."""
    return (importlib.import_module(f"specbench.methods.{MODULES[name]}").__doc__ or "").strip().splitlines()[0]


def catalog() -> dict[str, Any]:
    """JSON-ready: strategies (ar first) with their knobs and search space, controllers, combinations."""
    strategies: list[dict[str, Any]] = [{"name": BASELINE, "default_controller": None, "knobs": [],
                                         "description": "plain autoregressive decoding, the baseline of every run"}]
    for name, method in definitions().items():
        defaults = method.options()
        search = method.space.describe()
        knobs = [{"name": "controller", "default": method.default_controller, "unit": "",
                  "valid": " | ".join(CONTROLLERS), "search": search.get("controller"), "architecture": False,
                  "description": "how much to draft each step (see controllers)"}]
        knobs += _knobs(defaults, search)
        strategies.append({"name": name, "default_controller": method.default_controller, "knobs": knobs,
                           "description": _summary(name)})
    controllers = [{"name": name, "description": c.description, "reads": list(c.knob_names)}
                   for name, c in CONTROLLERS.items()]
    return {"strategies": strategies, "controllers": controllers, "combinations": list(COMBINATIONS),
            "combination_space": "a combination `a+b` searches its members' spaces, prefixed by member "
                                 "(eagle.depth), each member keeping its default controller, and how it combines "
                                 f"them ({COMBINE}.*)",
            "combine_knobs": _knobs(CombineOptions(), COMBINE_SPACE.describe())}


def _knobs(defaults: Any, search: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": knob, "default": getattr(defaults, knob), "unit": info.unit, "valid": info.valid_text(),
             "search": search.get(knob), "architecture": info.architecture, "description": info.description}
            for knob, info in knob_infos(defaults).items()]


HEADERS = ["knob", "default", "valid", "unit", "searched", "meaning"]


def _rows(strategy: dict[str, Any]) -> list[list[str]]:
    return [[k["name"], _text(k["default"]), k["valid"], k["unit"],
             "no (fixed by training)" if k["architecture"] else (k["search"] or "no"), k["description"]]
            for k in strategy["knobs"]]


def catalog_markdown(listing: dict[str, Any]) -> str:
    parts = []
    for s in listing["strategies"]:
        parts.append(f"## {s['name']}\n\n" + (markdown_table(HEADERS, _rows(s)) if s["knobs"]
                                             else "no knobs: " + s["description"]))
    parts.append("## controllers\n\n" + markdown_table(["controller", "what it does", "knobs it reads"],
                                                       [[c["name"], c["description"], ", ".join(c["reads"]) or "-"]
                                                        for c in listing["controllers"]]))
    parts.append("## combinations\n\n" + listing["combination_space"] + "; `all` adds "
                 + ", ".join(listing["combinations"]) + f"\n\n### {COMBINE}\n\n"
                 + markdown_table(HEADERS, _rows({"knobs": listing["combine_knobs"]})))
    return "\n\n".join(parts) + "\n"


def catalog_rich(listing: dict[str, Any]) -> Group:
    """One block per strategy, a knob per line with its meaning below: readable at 80 columns."""
    items: list[Any] = []
    combine = {"name": COMBINE, "description": "how a combination combines its members",
               "knobs": listing["combine_knobs"]}
    for s in listing["strategies"] + [combine]:
        items.append(Text(f"{s['name']}: {s['description']}", style="bold"))
        for name, default, valid, unit, searched, meaning in _rows(s):
            line = Text("  ")
            line.append(name, style="cyan")
            line.append(f" = {default}{' ' + unit if unit else ''}; valid {valid}; searched {searched}")
            items += [line, Text(f"      {meaning}", style="dim")]
    items.append(Text("controllers", style="bold"))
    for c in listing["controllers"]:
        reads = f" (reads {', '.join(c['reads'])})" if c["reads"] else ""
        items.append(Text.assemble("  ", (c["name"], "cyan"), f": {c['description']}{reads}"))
    items.append(Text(listing["combination_space"] + "; `all` adds " + ", ".join(listing["combinations"])))
    return Group(*items)
