"""What specbench knows: `specbench suites`, `specbench hardware` and `specbench strategies`."""

from __future__ import annotations

import json
import sys

from specbench.cli import options
from specbench.cli.app import app, out, user_errors


@app.command()
def suites(as_json: options.Json = False) -> None:
    """List the built-in suites with their categories and counts."""
    from specbench.plan.suites import builtin_suite_names, load_suite

    with user_errors():
        listing = {name: load_suite(name).categories() for name in builtin_suite_names()}
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
        return
    for name, categories in listing.items():
        out.print(f"{name}: {sum(categories.values())} prompts", highlight=False)
        for category, count in categories.items():
            out.print(f"  {category:<16} {count}", highlight=False)

@app.command()
def hardware(
    profiles: options.Profiles = None,
    as_json: options.Json = False,
) -> None:
    """List the GPU profiles and the local device."""
    from specbench.analysis.hardware import detect_local_gpu, hardware_listing, hardware_table, load_profiles

    with user_errors():
        known = load_profiles(profiles)
        local = detect_local_gpu()
    if as_json:
        sys.stdout.write(json.dumps(hardware_listing(known, local), indent=2, default=str) + "\n")
    else:
        out.print(hardware_table(known, local))


@app.command()
def strategies(as_json: options.Json = False) -> None:
    """List every strategy's knobs (default, valid range, unit, search range) and every controller."""
    from specbench.methods.catalog import catalog, catalog_markdown, catalog_rich

    listing = catalog()
    if as_json:
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
    elif out.is_terminal:
        out.print(catalog_rich(listing))
    else:
        sys.stdout.write(catalog_markdown(listing))
