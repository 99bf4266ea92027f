"""`tuner refine DIR`: a narrower sweep file around the best region of a finished sweep, which
warm-starts from it (coarse to fine).

The region is the top trials' (a quarter of those with a result, at least TOP_MIN): each
searched range shrinks to the span of their values, widened by MARGIN of that span on either
side (in log space for log ranges; at least MIN_SPAN of the old range where they all agree),
never beyond the old bounds; a choice keeps the values they used. The rest of the sweep file is
the sweep's own (sweep.yaml), with a new name and `search.warm_start` naming the sweep, so the
refined search starts from every earlier trial that falls inside it. A grid sweep keeps its
grid's values the top trials used and no warm start (grid search takes none).
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

from tuner.config import ConfigError, load_sweep
from tuner.config.load import to_yaml
from tuner.config.yamlfile import dump, load
from tuner.results import ranked, records
from tuner.space.params import Choice, Fixed, Grid, LogRandInt, LogUniform, ParamT, RandInt, Uniform
from tuner.sweepdir import full_config, read_config
from tuner.sweepdir.place import reading

TOP_FRACTION = 0.25  # of the trials with a result: the best region
TOP_MIN = 3
MARGIN = 0.25  # of the top trials' span, added on either side
MIN_SPAN = 0.1  # of the old span, when the top trials all have one value


def refine(sweep_dir: str, output: Optional[str] = None) -> tuple[str, dict[str, Any]]:
    """Write the refined sweep file (default `<name>_refined.yaml` here); (its path, the
    new `search.params`)."""
    local = reading(sweep_dir).readable()
    cfg = read_config(local, standins=True)
    trials = records(
        local, cfg.objective, cfg.objective_direction, cfg.schedule.max_epochs, list(cfg.search.params)
    )
    best = ranked(trials, cfg.objective_direction)
    if len(best) < 2:
        raise ConfigError("", f"{sweep_dir}: {len(best)} trial(s) with a result; refine needs 2 or more")
    top = best[: max(TOP_MIN, math.ceil(TOP_FRACTION * len(best)))]
    configs = [full_config(t.path) for t in top]
    params = {
        name: narrowed(p, [c[name] for c in configs if name in c]) for name, p in cfg.search.params.items()
    }
    data = load(to_yaml(cfg))
    data["name"] = f"{cfg.name}_refined"
    data["search"]["params"] = {name: _yaml(p) for name, p in params.items()}
    if cfg.algorithm.warm_starts:  # (grid: nothing to start from)
        data["search"]["warm_start"] = [os.path.abspath(local) if "://" not in sweep_dir else sweep_dir]
    path = os.path.abspath(output or f"{cfg.name}_refined.yaml")
    if os.path.exists(path):
        raise ConfigError("--output", f"{path} exists; name another file")
    header = (
        f"# Refined from {sweep_dir} by `tuner refine`: each searched range narrowed to where its\n"
        f"# best {len(top)} of {len(best)} trials were (by {cfg.objective}, {cfg.objective_direction}), "
        "warm-started from it.\n"
    )
    with open(path, "w") as f:
        f.write(header + dump(data))
    try:
        load_sweep(path)  # (read back as `tuner sweep` will)
    except ConfigError:
        os.remove(path)  # (a file that does not validate is not left behind)
        raise
    return path, params


def narrowed(p: ParamT, values: list[Any]) -> ParamT:
    """`p` around `values` (the top trials' values of it); as it was without any."""
    if isinstance(p, Fixed) or not values:
        return p
    if isinstance(p, (Choice, Grid)):
        kept = [v for v in p.values if v in values]
        return p.model_copy(update={"values": kept or list(p.values)})
    if isinstance(p, (Uniform, LogUniform, RandInt, LogRandInt)):
        return _range(p, [float(v) for v in values])
    return p


def _range(p: Any, values: list[float]) -> Any:
    log = isinstance(p, (LogUniform, LogRandInt))
    to = (lambda v: math.log(v)) if log else (lambda v: v)
    back = (lambda v: math.exp(v)) if log else (lambda v: v)
    low, high = to(float(p.low)), to(float(p.high))
    lo, hi = to(min(values)), to(max(values))
    pad = max(MARGIN * (hi - lo), MIN_SPAN * (high - low) / 2)
    # (the old bound itself where the margin reaches it: exp(log(x)) may not give x back)
    new_low = float(p.low) if lo - pad <= low else max(float(p.low), back(lo - pad))
    new_high = float(p.high) if hi + pad >= high else min(float(p.high), back(hi + pad))
    if isinstance(p, (RandInt, LogRandInt)):
        new_low, new_high = math.floor(new_low), math.ceil(new_high)
        if new_high <= new_low:
            new_high = min(int(p.high), new_low + 1)
            new_low = new_high - 1
        return p.model_copy(update={"low": int(new_low), "high": int(new_high)})
    return p.model_copy(update={"low": new_low, "high": new_high})


def _yaml(p: ParamT) -> Any:
    if isinstance(p, Fixed):
        return p.value
    return p.model_dump(mode="json", exclude_none=True)
