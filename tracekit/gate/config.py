"""What ``tracekit check`` checks: limits from flags and from ``[tool.tracekit.check]``.

The table is looked for in the closest ``pyproject.toml`` at or above the working folder
that has one (or in the file given with ``--config``)::

    [tool.tracekit.check]
    max-bubble = 0.35            # run bubble ratio (idle over the step window)
    max-rank-bubble = 0.40       # every rank's bubble ratio
    baseline = "baselines/train.json"   # relative to this file
    tolerance = 0.02             # absolute: baseline 0.31 fails above 0.33
    allow-incomplete = true      # check a run with ranks missing, on the ranks present
    max-step-ms = 520            # the mean step window, in milliseconds
    step-tolerance = 0.10        # relative: baseline step 500 ms fails above 550 ms (default: off)

    [tool.tracekit.check.max-cause]      # a cause's share of the step window
    comm = 0.10

    [tool.tracekit.check.cause-tolerance]
    comm = 0.03

Flags given on the command line win over the file, key by key. Every limit remembers where
it came from, so a failure line can say which setting it broke.

Step time is held to a baseline only when ``step-tolerance`` is set: unlike a bubble ratio
(a share of the step, much the same on any machine) it moves with the GPU model, clocks and
the neighbours on a shared node, which a baseline does not record, so a gate on it is a
choice made for one known machine, never a default that turns existing gates red.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tracekit.errors import TracekitError
from tracekit.pyproject import find_table, read_toml
from tracekit.vocab import CATEGORIES, IDLE_CAUSES

DEFAULT_TOLERANCE = 0.02
TABLE = "[tool.tracekit.check]"
_KEYS = (
    "max-bubble",
    "max-rank-bubble",
    "max-cause",
    "baseline",
    "tolerance",
    "cause-tolerance",
    "allow-incomplete",
    "max-step-ms",
    "step-tolerance",
)
_CAUSE_ALIASES = {alias: c.key for c in IDLE_CAUSES for alias in c.aliases}


@dataclass(frozen=True)
class Limit:
    """A number and where it was set (``--max-bubble``, ``pyproject.toml max-bubble``): a share
    of the step window, except ``max_step_ns`` (ns) and ``step_tolerance`` (of the baseline's step)."""

    value: float
    origin: str


@dataclass
class CheckConfig:
    max_bubble: Limit | None = None
    max_rank_bubble: Limit | None = None
    max_cause: dict[str, Limit] = field(default_factory=dict)
    baseline: Path | None = None
    tolerance: Limit = Limit(DEFAULT_TOLERANCE, "default")
    cause_tolerance: dict[str, Limit] = field(default_factory=dict)
    allow_incomplete: bool = False  # check a run with ranks missing (on the ranks present)
    max_step_ns: Limit | None = None  # the mean step window
    step_tolerance: Limit | None = None  # relative to the baseline's step; None: step time not compared
    config_file: Path | None = None

    @property
    def has_checks(self) -> bool:
        return bool(self.max_bubble or self.max_rank_bubble or self.max_cause or self.baseline or self.max_step_ns)

    def require_checks(self) -> None:
        if not self.has_checks:
            raise TracekitError(
                "nothing to check: give --max-bubble, --max-rank-bubble, --max-cause, "
                f"--max-step-ms or --baseline, or put them in {TABLE} in pyproject.toml"
            )
        if (
            self.step_tolerance is not None
            and self.step_tolerance.origin == "--step-tolerance"
            and self.baseline is None
        ):
            # a tolerance from the file may wait for a --baseline; one typed now would do nothing
            raise TracekitError(
                "--step-tolerance compares the step time with a baseline: add --baseline FILE "
                "(or baseline = ... in pyproject.toml), or give a fixed --max-step-ms"
            )
        if self.baseline is None:
            typed = (["--tolerance"] if self.tolerance.origin == "--tolerance" else []) + (
                ["--cause-tolerance"]
                if any(t.origin.startswith("--cause-tolerance") for t in self.cause_tolerance.values())
                else []
            )
            if typed:  # it would have done nothing, silently
                raise TracekitError(
                    f"{' and '.join(typed)} set how far a run may move from a baseline, and "
                    "there is none: add --baseline FILE (or baseline = ... in pyproject.toml), "
                    "or give fixed limits (--max-bubble, --max-cause CAUSE=SHARE)"
                )

    def tolerance_for(self, cause: str) -> Limit:
        return self.cause_tolerance.get(cause, self.tolerance)


def cause_name(text: str, where: str) -> str:
    """The attribution category a user means by ``text`` (``comm``, ``gaps``, ...)."""
    name = text.strip().lower()
    name = _CAUSE_ALIASES.get(name, name)
    if name not in CATEGORIES:
        raise TracekitError(f"{where}: unknown cause {text!r}; use one of {', '.join(CATEGORIES)}")
    return name


def share(value: object, where: str) -> float:
    """A share of the window, 0..1; ``"10%"`` is accepted for 0.10."""
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise TracekitError(f"{where}: {value!r} is not a number; give a share such as 0.10 (or 10%)") from None
    if isinstance(value, bool) or not 0.0 <= number <= 1.0:
        raise TracekitError(f"{where}: {value!r} is not a share between 0 and 1; write 0.10 (or 10%) for 10 percent")
    return number


def step_ms(value: object, where: str) -> int:
    """A step time limit in milliseconds (``520``, ``520.5``), as ns."""
    try:
        number = float(str(value).strip())  # TOML's true reads "True": not a number
    except ValueError:
        raise TracekitError(
            f"{where}: {value!r} is not a number; give the step time in milliseconds, e.g. 520"
        ) from None
    if not 0.0 < number < float("inf"):
        raise TracekitError(f"{where}: {value!r} is not a step time; give a positive number of milliseconds, e.g. 520")
    return round(number * 1e6)


def cause_items(items: dict[str, object] | Iterable[str], where: str) -> dict[str, Limit]:
    """``("comm=0.10", ...)`` (flags) or ``{"comm": 0.10}`` (config) -> cause -> limit."""
    out: dict[str, Limit] = {}
    pairs = items.items() if isinstance(items, dict) else (_split(item, where) for item in items)
    for key, value in pairs:
        cause = cause_name(str(key), where)
        out[cause] = Limit(share(value, f"{where} {key}"), f"{where} {cause}")
    return out


def _split(item: str, where: str) -> tuple[str, str]:
    cause, sep, value = item.partition("=")
    if not sep or not cause.strip() or not value.strip():
        raise TracekitError(f"{where}: {item!r} is not CAUSE=SHARE; write e.g. {where} comm=0.10")
    return cause, value


def find_config(start: Path) -> Path | None:
    """The closest pyproject.toml at or above ``start`` that has a [tool.tracekit.check] table."""
    return find_table(start, "check")


def load_config(path: Path) -> CheckConfig:
    """The limits in ``path``'s [tool.tracekit.check] table."""
    tracekit_table = read_toml(path).get("tool", {}).get("tracekit")
    if tracekit_table is None or "check" not in tracekit_table:
        raise TracekitError(f"{path}: has no {TABLE} table; add one or give the limits as flags")
    table = tracekit_table["check"]
    if not isinstance(table, dict):
        raise TracekitError(f"{path}: {TABLE} must be a table")
    where = f"{path.name} {TABLE}"
    config = CheckConfig(config_file=path)
    for raw_key, value in table.items():
        key = raw_key.replace("_", "-")
        origin = f"{path.name} {key}"
        if key not in _KEYS:
            raise TracekitError(f"{path}: unknown key {raw_key!r} in {TABLE}; known keys: {', '.join(_KEYS)}")
        if key in ("max-cause", "cause-tolerance"):
            if not isinstance(value, dict):
                raise TracekitError(f"{path}: {key} must be a table such as {key} = {{ comm = 0.10 }}")
            limits = cause_items(value, f"{path.name} {key}")
            if key == "max-cause":
                config.max_cause = limits
            else:
                config.cause_tolerance = limits
        elif key == "allow-incomplete":
            if not isinstance(value, bool):
                raise TracekitError(f"{path}: allow-incomplete must be true or false, not {value!r}")
            config.allow_incomplete = value
        elif key == "max-step-ms":
            config.max_step_ns = Limit(step_ms(value, f"{where} {key}"), origin)
        elif key == "baseline":
            if not isinstance(value, str):
                raise TracekitError(f"{path}: baseline must be a path (a string)")
            config.baseline = (path.parent / value).resolve() if not Path(value).is_absolute() else Path(value)
        else:
            setattr(config, key.replace("-", "_"), Limit(share(value, f"{where} {key}"), origin))
    return config


def with_flags(
    config: CheckConfig,
    *,
    max_bubble: str | None,
    max_rank_bubble: str | None,
    max_cause: tuple[str, ...],
    baseline: Path | None,
    tolerance: str | None,
    cause_tolerance: tuple[str, ...],
    allow_incomplete: bool = False,
    max_step_ms: str | None = None,
    step_tolerance: str | None = None,
) -> CheckConfig:
    """``config`` with the command-line flags laid over it (flags win, key by key)."""
    out = replace(config, max_cause=dict(config.max_cause), cause_tolerance=dict(config.cause_tolerance))
    if max_bubble is not None:
        out.max_bubble = Limit(share(max_bubble, "--max-bubble"), "--max-bubble")
    if max_rank_bubble is not None:
        out.max_rank_bubble = Limit(share(max_rank_bubble, "--max-rank-bubble"), "--max-rank-bubble")
    out.max_cause.update(cause_items(max_cause, "--max-cause"))
    if baseline is not None:
        out.baseline = baseline
    if tolerance is not None:
        out.tolerance = Limit(share(tolerance, "--tolerance"), "--tolerance")
    out.cause_tolerance.update(cause_items(cause_tolerance, "--cause-tolerance"))
    out.allow_incomplete = out.allow_incomplete or allow_incomplete
    if max_step_ms is not None:
        out.max_step_ns = Limit(step_ms(max_step_ms, "--max-step-ms"), "--max-step-ms")
    if step_tolerance is not None:
        out.step_tolerance = Limit(share(step_tolerance, "--step-tolerance"), "--step-tolerance")
    return out
