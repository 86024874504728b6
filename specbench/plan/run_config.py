"""The resolved configuration of a run: defaults < TOML config file < command-line flags.

Everything here is torch-free, so a bad configuration is refused at once, before torch is
imported or a model loads: value types (pydantic, strict: a TOML `max_new_tokens = "abc"` is
refused, not compared with an int later), ranges and choices, strategy names, knobs only for
strategies that are run, the controller, the suite and its categories, where the model is, the
GPU profile and the output directory. Knob values are checked next, by the method modules.

Checking resolves: `RunConfig.plan()` reads each input once (the strategies, the drafters' formats, the
selected prompts, the model's directory, the GPU profile, the engines) into the run's frozen `RunPlan`,
which every later step takes as it is; the configuration itself is never changed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from specbench.analysis.hardware import GpuProfile, get_profile, load_profiles
from specbench.core.errors import SpecbenchError
from specbench.core.files import read_toml
from specbench.core.paths import check_output_dir
from specbench.core.ranges import check_device, check_dtype, check_ranges, check_sizes
from specbench.decoding.model_source import model_path
from specbench.engines.engine_registry import REFERENCE, check_engines
from specbench.engines.protocol import EnginePlan
from specbench.methods.controllers import CONTROLLERS
from specbench.methods.knobs import check_knobs_apply
from specbench.methods.names import StrategyName, parse_strategies, parse_strategy
from specbench.methods.published.formats import DrafterSource, drafter_dirs_by_strategy
from specbench.plan.sharegpt import conversation_suite
from specbench.plan.suites import Suite, load_suite, select


@dataclass
class DecodeSettings:
    """What a run and a training (training/settings.py) share: the target and where it runs, how many
    prompts and how long the answers, the seed and the strategies' knobs."""

    model: str | None = None  # a known model (decoding/model_source.py), HF id, local directory; None: the default
    limit: int | None = 8  # prompts, spread over the categories; 0 or None: the whole suite
    max_new_tokens: int = 64
    seed: int = 0
    device: str = "auto"
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # strategy -> knob -> value


@dataclass
class RunConfig(DecodeSettings):
    # strict types; instances are re-checked when validated (pydantic reads this, dataclasses ignore it)
    __pydantic_config__ = ConfigDict(strict=True, revalidate_instances="always", allow_inf_nan=False)

    drafters: list[str] = field(default_factory=list)  # drafter directories
    strategies: list[str] = field(default_factory=lambda: ["default"])
    suite: str = "default"
    dataset: str | None = None  # "sharegpt" or a file in ShareGPT's layout: its conversations instead of the suite
    multi_turn: bool = False  # --dataset: every user turn of a conversation, not the first alone
    categories: list[str] = field(default_factory=list)
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    dtype: str = "auto"
    warmup: int = 1  # warm-up passes at least (an engine that compiles repeats them until they settle)
    warmup_cap: int = 10  # an engine that compiles: warm-up passes at most
    outlier_k: float = 5.0  # a prompt above median + k * MAD of its strategy's seconds per token is measured again
    repeats: int = 1
    out: str = "results"
    controller: str | None = None
    gpu: str | None = None
    profiles: str | None = None  # TOML file with extra GPU profiles
    cost_model: bool = True  # time the forwards the cost model predicts from (stored, reused by later runs)
    batch_sizes: list[int] = field(default_factory=lambda: [1])  # each runs in turn; prompts decoded B at a time
    # strategy -> {"batch_sizes": [...], "draft_tokens": [...]}: at most that many drafts per step from each
    # listed batch size on (vLLM's num_speculative_tokens_per_batch_size; 0 = plain decoding)
    draft_schedule: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    engine: str = "specbench"  # an engine, an alias (both) or a comma list of them (engines/engine_registry.py)
    engine_args: dict[str, Any] = field(default_factory=dict)  # the engine's own arguments (--engine-args JSON)

    def validate(self, where: str = "configuration") -> RunConfig:
        """This configuration, checked as `plan` checks it, for a caller that keeps the configuration itself
        (a run directory read back, a server's); `where` names its source."""
        return self.plan(where).config

    def plan(self, where: str = "configuration") -> RunPlan:
        """What this configuration resolves to, after every check that needs no torch; `where` names its source.

        Each input is read here once (the suite, the drafters' formats, the model's directory, the GPU
        profiles) and every later step takes the plan as it is. The configuration is left as it was: the
        plan holds its checked copy."""
        config = checked_types(self, where)
        check_ranges({"--max-new-tokens": config.max_new_tokens, "--temperature": config.temperature,
                      "--top-p": config.top_p, "--top-k": config.top_k, "--limit": config.limit,
                      "--seed": config.seed, "--warmup": config.warmup, "--repeats": config.repeats,
                      "--warmup-cap": config.warmup_cap, "--outlier-k": config.outlier_k})
        limit = config.limit or None  # 0: the whole suite
        check_dtype(config.dtype)
        check_device(config.device)
        if config.controller is not None and config.controller not in CONTROLLERS:
            raise SpecbenchError(f"unknown controller {config.controller!r}; known: {', '.join(CONTROLLERS)}")
        specs = parse_strategies(config.strategies)
        check_knobs_apply(config.knobs, specs)
        sources = drafter_dirs_by_strategy(config.drafters, specs)  # formats: read, not loaded
        suite = select(prompt_suite(config, limit), config.categories or None, limit)
        model = model_path(config.model)
        profiles = load_profiles(Path(config.profiles) if config.profiles else None)
        profile = get_profile(config.gpu, profiles) if config.gpu else None
        check_output_dir(config.out, "--out")
        check_sizes(config.batch_sizes, "--batch-sizes")
        for strategy, entry in config.draft_schedule.items():
            check_draft_schedule(strategy, entry)
        schedule = {parse_strategy(name).name: entry for name, entry in config.draft_schedule.items()}
        engine = EnginePlan(tuple(specs), config.knobs, config.controller, config.batch_sizes, config.temperature,
                            config.engine_args, model, config.device, config.dtype, config.seed, sources, schedule)
        engines = check_engines(config.engine, engine)
        config = dataclasses.replace(config, limit=limit, draft_schedule=schedule)
        return RunPlan(config, tuple(specs), sources, suite, model, engines, profile, engine, REFERENCE)


@dataclass(frozen=True)
class RunPlan:
    """A run's configuration resolved: what every step after the checks takes as it is."""

    config: RunConfig  # checked: 0 for the whole suite read as no limit, the draft schedule's strategies by name
    strategies: tuple[StrategyName, ...]  # `ar` first
    drafter_sources: dict[str, DrafterSource]  # method -> its drafter's checkpoint and format
    suite: Suite  # the selected prompts (--categories, --limit)
    model: str  # the target's directory, or the hub id it is cached under
    engines: tuple[str, ...]  # the engines listed, aliases expanded
    profile: GpuProfile | None  # the --gpu profile to project onto
    engine: EnginePlan  # what the engines are checked against and made from
    # the engine whose `ar` runs in every run (listed or not): the other engines' `ar` is checked against its
    # greedy outputs, and the noise check, the projection and the load axis read its rows
    reference: str


def prompt_suite(config: RunConfig, limit: int | None) -> Suite:
    """The suite a run draws its prompts from: --suite's, or the first `limit` conversations of --dataset."""
    if config.dataset is None:
        if config.multi_turn:
            raise SpecbenchError("--multi-turn answers every user turn of a --dataset's conversations: give "
                                 "--dataset sharegpt or a file")
        return load_suite(config.suite)
    if config.suite != RunConfig.suite:
        raise SpecbenchError("--dataset replaces the suite's prompts: give --suite or --dataset, not both")
    return conversation_suite(config.dataset, config.multi_turn, limit)


def check_draft_schedule(strategy: str, entry: Any) -> None:
    where = f"draft_schedule.{strategy}"
    if not isinstance(entry, dict) or set(entry) != {"batch_sizes", "draft_tokens"}:
        raise SpecbenchError(f"{where} must hold exactly batch_sizes = [...] and draft_tokens = [...]")
    check_sizes(entry["batch_sizes"], f"{where}.batch_sizes")
    tokens = entry["draft_tokens"]
    if (not isinstance(tokens, list) or len(tokens) != len(entry["batch_sizes"])
            or any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in tokens)):
        raise SpecbenchError(f"{where}.draft_tokens must hold one integer >= 0 per batch size")


FIELDS = {f.name for f in dataclasses.fields(RunConfig)}
ALIASES = {"strategy": "strategies", "drafter": "drafters", "category": "categories"}
LISTS = ("strategies", "drafters", "categories")  # a single string is a list of one
OPTIONS = {"strategies": "--strategy", "drafters": "--drafter", "knobs": "--set"}  # the flag of each field
_TYPES = TypeAdapter(RunConfig)
_EXPECTED = {"int_type": "an integer", "float_type": "a number", "finite_number": "a finite number",
             "string_type": "a string", "bool_type": "true or false", "dict_type": "a table", "list_type": "a list"}


def option(name: str) -> str:
    """The command-line flag that sets the field `name`."""
    return OPTIONS.get(name, "--" + name.replace("_", "-"))


def checked_types(config: RunConfig, where: str, keys: dict[str, str] | None = None) -> RunConfig:
    """`config` with every field checked against its type; `keys` maps fields to the names the user wrote."""
    try:
        return _TYPES.validate_python(config)
    except ValidationError as exc:
        error = exc.errors()[0]
        name, *inner = error["loc"]
        key = (keys or {}).get(str(name), str(name)) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}"
                                                               for p in inner)
        expected = _EXPECTED.get(error["type"])
        if name in LISTS and not inner:
            expected = "a string or a list of strings"
        what = f"must be {expected}" if expected else error["msg"][0].lower() + error["msg"][1:]
        raise SpecbenchError(f"{where}: {key} {what}, got {error['input']!r}") from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a TOML run config: top-level keys are RunConfig fields; [knobs.STRATEGY] tables hold knobs."""
    return checked_settings(read_toml(Path(path), "config file"), f"config file {path}")


def checked_settings(raw: dict[str, Any], where: str) -> dict[str, Any]:
    """RunConfig's fields from settings written as a TOML config writes them (`strategy` for `strategies`, `-`
    for `_`, one string for a list of one), type-checked; `where` names their source."""
    values, keys = {}, {}
    for key, value in raw.items():
        name = ALIASES.get(key.replace("-", "_"), key.replace("-", "_"))
        if name not in FIELDS:
            raise SpecbenchError(f"{where}: unknown key {key!r}; known: {', '.join(sorted(FIELDS))}")
        if name in LISTS and isinstance(value, str):
            value = [value]
        values[name], keys[name] = value, key
    checked_types(RunConfig(**values), where, keys)
    return values


def resolve(file_values: dict[str, Any], flags: dict[str, Any], saved: RunConfig | None = None) -> RunPlan:
    """Defaults, then the config file, then every flag that was given (None means not given), planned.

    With `saved`, the configuration of a run being resumed, that configuration is the result: a
    file value or flag may repeat it, and one that differs is refused (it would change what the
    run measures).
    """
    if saved is None:
        return layered(file_values, flags).plan()
    _refuse_changes(saved, _settings(file_values, flags), _knobs(asdict(saved)["knobs"], file_values, flags))
    return saved.plan()


def layered(file_values: dict[str, Any], flags: dict[str, Any]) -> RunConfig:
    """Defaults, then the config file, then every flag that was given, not yet validated: for a caller that
    validates it as part of something larger (tune's workload)."""
    return RunConfig(knobs=_knobs({}, file_values, flags), **_settings(file_values, flags))


def _settings(file_values: dict[str, Any], flags: dict[str, Any]) -> dict[str, Any]:
    """Every setting but the knobs: the file's, then each flag that was given."""
    given = {k: v for k, v in flags.items() if v is not None and v != []}
    return {k: v for k, v in {**file_values, **given}.items() if k != "knobs"}


def _knobs(base: dict[str, dict[str, Any]], file_values: dict[str, Any],
           flags: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Knobs merged per strategy: the base's, then the file's, then the flags'."""
    knobs = {k: dict(v) for k, v in base.items()}
    for layer in (file_values.get("knobs", {}), flags.get("knobs", {})):
        for strategy, values in layer.items():
            knobs.setdefault(strategy, {}).update(values)
    return knobs


def _same(name: str, a: Any, b: Any) -> bool:
    if name == "strategies":
        return [s.name for s in parse_strategies(a)] == [s.name for s in parse_strategies(b)]
    if name == "knobs":  # `--set draft.k=4` is the string "4", a TOML knob the number 4
        def text(knobs):
            return {s: {k: str(v) for k, v in values.items()} for s, values in knobs.items() if values}
        return text(a) == text(b)
    return a == b


def _shown(name: str, value: Any) -> str:
    if name == "knobs":
        return ",".join(f"{s}.{k}={v}" for s, values in value.items() for k, v in values.items()) or "(none)"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(none)"
    return str(value)


def _refuse_changes(saved: RunConfig, given: dict[str, Any], knobs: dict[str, dict[str, Any]]) -> None:
    changes = [(name, value) for name, value in {**given, "knobs": knobs}.items()
               if not _same(name, value, getattr(saved, name))]
    if changes:
        listed = ", ".join(f"{option(name)} {_shown(name, value)} (the run has {_shown(name, getattr(saved, name))})"
                           for name, value in changes)
        raise SpecbenchError(f"--resume continues a run with its saved configuration: {listed} would change what it "
                             "measures; drop it to resume, or start a new run")
