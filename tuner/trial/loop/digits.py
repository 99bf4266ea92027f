"""sklearn's 8x8 digits without importing scikit-learn (about 1 s of every trial process's start).

The images are read from the file scikit-learn ships (`sklearn/datasets/data/digits.csv.gz`,
found without importing the package), and the default split (a quarter for validation,
stratified, `random_state=0`) is the one `train_test_split` gives, recorded here as indices:
`tests/test_loop.py` checks both against scikit-learn itself. Other validation fractions, or
a scikit-learn whose file is not where this looks, go through scikit-learn.
"""

from __future__ import annotations

import base64
import importlib.util
import os
from typing import Optional

import numpy as np

SAMPLES = 1797
RECORDED_VAL_FRACTION = 0.25
N_VAL = 450  # of SAMPLES, at RECORDED_VAL_FRACTION
# train_test_split(np.arange(1797), y, test_size=0.25, random_state=0, stratify=y): the train
# indices then the validation ones, uint16 little-endian, base64 (`python -m tuner.trial.loop.digits`).
SPLIT = (
    "vwFEA9UGkgCwBKMDEAZ9AAwBxwE3AY8CuQUPARMG1AbPBD8C7gJ2AEwCPwPGAiwE9QX3A2sFWgLXANcCwgETAkICtACmAl4B"
    "DAa0BfYFQAFnBAYFCwCUBQ4GQwQoBW4BogM4BEEEwwGEAfkCBAdbAdkCtQLCBt8BaAVMBtADuwHaBT8EIQYhBOsF+wEsBe8C"
    "DQBIAq8E9gL+BlcEcABXAVkAjgCRAjgGJwHvAZAA+wVFAJkBcQYJAnEElwQYBJ0ApwaFAmkCjgYtBCMCvQMZBR4AfgAkAqQD"
    "0gKyAYYEBAVlAo8BwQDZBCEBrwJABtgD8AMaBTcDXwQABs4D2gKaBJUCBAGTAiMF5gQQAPkBjQMfAHwC9gEjBo4CuQObAH8F"
    "BwQ+AkwFoAPxBvsC0AF4ACIEXwYsBrYD6gXQAAkA2gDZAOEAkgUuAXcCJAY3AFUE7gbjBtwEkwM5Bl8C7wB6BJ8DRgQyBuED"
    "agV/AGoCqAByBZMGKwRbA+QBXgMfAhgFdwPQAosCNgVWBmABPwH0ALcBgAUiAnUBAQXkAF0BTwCwBowFYwI1BhsArAGMAGIB"
    "8QC3BW8AwgSdBPsEjwafBsMEtQWnBIsAfgNMAGEAbgYlBWwElQD9BKsGmACRALACkQExBgoGwwMtAZoD4wFwBqsEwgBjBWIA"
    "5AaiAssFYwPKBqEFtQC8BiQAIQJwA0EAAwG5AoUGigNmBPsA4ALXBawA/QVyA5wBVgJZBdYDBQMqBUUGdgUOBRQGtAbmBoEB"
    "zAEvBnsAAABpAUIFtgRmAwcD3QTjBC0CGQHqAI8F1AXLAQEGeQN5BVYAyABpBn8BSwFeAgEE+QbqAu4AHQIIBcYDUgGxAtQE"
    "PgUxBTsCiwHoBhABKwAaBGoEzQLJAdoGAQcIBv0DYAbQBt8CsgXuBY0EFgToARoAOwDqBGoDxwD3BJgF+wMhA5YCHwW5BqwC"
    "UgBbAsoEmQTNBKgDZADJAjQCfAN6Ab4B9AalBg4BEgH5AG8GFQSZBucC1wR4BBUCEgY7BCEAMwT3AvoCMgP6BPECRAToA2QB"
    "NgSmBc8AhgWAAnoCzgUoAd0GFADIA1IC/gV9BNEAbwOCA80BawMUAgEAgQb8AfoACAMZAjgAmQWSA3kEMwJnBYMEewUlAu8G"
    "jgWrAwoFiAbuATUBOgZJAqMAuAORBtUD/QJIAD0EyQU8BNMGrAPOAZ8BBgImAIUAVAFKAUsFywIvAfMCQQOYAx0B4AWUAtsD"
    "nwX2BkADrAVzA4kFhgFUBn8DQwJHBA0BowF5BkcG6wANBdwGtAE6ABYCAgRYBJcChwG2Ba0GsAWTANgACgK4BmEGZwaBBaUB"
    "5QZiBeEGtwDzBv8FqQJZBm4CGwXeAbMDgAGgAuwDQwDbAD8FKQA9BXsD7wXWBcABNgKtBXoA+gY7BbkAHgK8AQUEWAVrBlYE"
    "qwEZA34GqAIcAroEQgECBacCAgHeAHEBzgJgBb4DZwFQBSQE0wQDBoQFuQSGA+AAvAXYArYBPgFDBgMHVgGMARUGbgNhBWYC"
    "CQM6BJUD4wKdA7sDTQP4ABgCuwKjBukAEwTBA0wEgwVsBe0GvwASBKgBOQGlBBwEiAL1AUYCBgOyANAFSQQRBDEDhwZNAe0A"
    "LgVYA5kAdwHyBEoDswX6A2YBVwL3ABECdAIgAZQG0QKzAGMB3QGmBlAGTQJtAGIEwgOeBhIChQFJAV0DtQTOBEsD3QLRBZoA"
    "5gEVAWsARQGUA5kC/QBTAz0GLwImBBAEUQT5BAIHWQQmBbMEDQIjAcQDWwCLBIgFvwS/A6UDdADvBIoAmgVsACYBeQFrBHMC"
    "AQNXBtUCyQBHAOQDGwN9AboDwwZEAD0B0gXZBrkBGAPVAZIBUwZDAWkDUAGcA6sCLwRtBOEE2AZOBcMCzwGDBmgAWgPCAswE"
    "7ATdBUoCGgFtAvgFxAJvAQYArwFJAOsCagGOASoDtAP5A+kEcwRfAZYAbwIeA30GNQA9AMkD2gMMBOsEPgahBBADkganA7cC"
    "kwQLBo0CqQQ+ACkDQgDIAe0FIAAiAR0GxQNQAhEGngIZAMcEJANHATAF4gHVBBcGsQA2AAQAfADfBIMCTgLcAn4CVALdAAwA"
    "wASWBuIA+AaNAFMFTgPNBtMCxAByAC4EpgEPAAkEWgAvA4gBQQGvAAIG1AIAB/cBnQaSArEFXQCrBZcDSQaPAEwBXgZqANoB"
    "/gTYBPgBmgZkBWUELgPIAhwGsgQPBIcARQUgBpwFDgDZAfQFUQXpAk0FvAQMA1EBpAK2BqUCOgItBTwBcAK9AYIArQFgA9MF"
    "WgVtBYEAIwNpBYQE5gPDAJ0CdgLUAXcEKQQJBscDNQPpBgcC1wExAAACnwTLBOUAvAMgAqwEjQUmAocDiQAWA+wBTwVxA28F"
    "mAJWBecFdgMVBdUFCACCBFAEkAJQAJYFWAAdA64FdATWATQA5gILBSsBhgayBmgBygJZAq8GTwTSBKsAewTRAVMCewYaBl4F"
    "lQZCA0oAeQAFAAMA8QQdAHAFTwPFAaMFAAWLBvwEsgLHBh8BJwK9AB0FFwJAAnMB1gJVAiwAcQIEAk4BnQUkBUQF5AUlBOgE"
    "TwaXBQkB6wFcAV0F3wO0Aq4AkQXiBcsATgS9BRMASgXnA+UBMABiA6IG/gG4BKkAWAJEAjwCCgQcA/IAAwJfA4UDigECAgoD"
    "QQIrAjIEWAZEBoUFMAY9AykG5AJRAxQFpQA8A3ICoAAiBogErgSOA4cCsAA0BlMAJwSeBcEGdAUHAQUBQQYoApYBpAUXAycD"
    "pwBxAL0EcAFmBTMGOANzBscCswInBmgEZQMyAPwDmwEiBTYBdAZyAaoERQIOA4wGMAO+AFsEZQCeBHEFPABvBBcF1wMyAggE"
    "UAOBBDEC4gMqBMwDKQGzAQMFNwSbBK4GdgaQAUQBjgS4AEsEggUNA2gDHAXzA6oCUgbHBR8EzAZtAWQD4AELA3gCZQXSBo0G"
    "rgLUA9EGdQZ4BnoGTwKBA0AArAaYAUcCRgDzBVIE6QP3BioCZwJqBncFlAE7BqABBQacArgCOwH/BGsBCQU/AMgGjARlAa0C"
    "VQZaBP8AHgRVBbYAgAPGBeMFSwbmALcGAQFJA7oC9QIKAaQECwKhAhkGwwV0A2gGEQEYAacFOgMKAPUDSAM5A60EmQNSA7UB"
    "9AKlBaYEiwMCAGwGpADnARcAqgEHBoAA3wZGA5ADbQN5AtYEOwOCAvIFKADXBjoFYwYFAvwC5ARHA5cATANVAIgAWwa9BhwB"
    "ewLSADUE2wUSAOIG6QH8Bs8DJAHbBHUCyQZgBMkEEQMFBRQEUgW/AmkEXgANBr8GKgboAF0CLAFBBZ4ArQPTA4oFIwSmAzkF"
    "8wQbAkMDwQG7AMEFxAbcBeIE+AR/BjUFegWRA6IB8ALbAaIA3gWgBGcDnABcAC0GkwWxBqEAYQL9ARYByAVABTMDAAEuAkUE"
    "5gXsAogD/gPLA2wCJQYEBC8AhgKLBW4EFgC4BfcF4QLfAGQEZAYrBc4ABwDgBKIEqQbqAfICZAJzAJ4B8gHPBsUFbgV2BLoG"
    "VQHNBdwBKARdBAYBEQDABZQEnwLAAFQAMATGBK4DVAUrBv8DmAR/BDgBMwHGAVgB2AWQBSoAfwIHBScAAQLQBNwAwAatABkE"
    "UQLtA3MF9gPgBlEGNAETBYoClgN8AS0D8QVNBhoCYQEGBnwGXwDWANEEjQGqADQDxAEoA0gE4wC9AokC3wV1BBsGXAYYBsoB"
    "tQYuAIoEYQQXBLUD1QBNAEsA4gKSBDkC9QDnADIFIgCpBYwDlgQ0BbEEvgWfAEgGrgFjAF0G5QKCBpEEMQTKA8IF7QJKBuoG"
    "fgXBBPIGEwHFAMUGIAOGABQBgwHRAwAEYAIPBcUC2wZlBrQE8gPxAXcAVQOaAvAA/gCjBPUEhAYlA+UEugUAA/wFMwUYALED"
    "NQIEAysDygCcBh8DuwXZBf8GiQHAAvYENwWdAbADRgUPAv8C3QOUAK8FUwTeAhcBFAPnBIQDmwWbBpUBygWmALgBeAN4BU4A"
    "kAT0A8YAgwAwAVcA8AHbAh4BGwF3BnoDOQBNBOMDvABCBrsE3gT1BiEFfQXcA1MBKAZIBagEvwXeA4kENgZGAW0G6QXEBdID"
    "eAEMBUYG+QV1AL4GWgGEAIMDSwKzBnYBQwUnBYcFfgQaA9QApAaaAWgCpwGBAmwDbgBUBLIDFQBhAwsBfQPMAhIDqQGVBCMA"
    "zAWCAXwE+wbqA54DIASgBVYDEQXSAR8GqQMvBWIGoQHhAYkDMgEQApsDqAXBAhYGLgbeBmICigZnACAFLANbBcUENwIpAr4C"
    "KQVsAdoE+ANABHQBowJFA+sDAgMPBvoFvgRCBJwEXAKhBhAFqAb4Aj4DUQDhBXUDxgYqAV4EtwTMAD4EDQTLBuUDEgUbBCYD"
    "pAHOBjQE8QMPA7oBhAJUAwsEDgLzAJUF8wHlBdgB7ACbAnAEawJ1BZAG9AGqBjkE7QFcBD8GfQJXAx4FrwO6AEgBfgE8BUcF"
    "iQaFBDcGHQQ9AjgFFQPsBSUBJQAIAZcBAwTvA4AE0wAtACYGyAQ6AY8D2QOXBkoEhwTAA04GLAJfBVoGjALuBOsGkwEMAggC"
    "zwU4Ag4EsQEGBAQGYwR8BfwAtwOPBJgGcgRmAPQEYADnBu0EqgVZAyIDFgXoBe4DqgPNABMDNgPNAzwGWQExAbwCsAFpAHsB"
    "/gJmBjMA+gHoAhwATwGABvYAoQO2AqAGVwWiBTACcgbgA9YG0wHEBEkF/QbPAvAGXAP/AR4GuwbsBvAFXAXwBAMD"
)


def load(val_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, x_val, y_train, y_val): x as uint8 (N, 1, 8, 8) pixel values 0..16, y int64."""
    arrays = _read_shipped()
    split = recorded_split() if val_fraction == RECORDED_VAL_FRACTION else None
    if arrays is None or split is None:
        return _through_sklearn(val_fraction)
    x, y = arrays
    train, val = split
    return x[train], x[val], y[train], y[val]


def recorded_split() -> Optional[tuple[np.ndarray, np.ndarray]]:
    if not SPLIT:
        return None
    idx = np.frombuffer(base64.b64decode(SPLIT), dtype="<u2").astype(np.int64)
    return idx[: SAMPLES - N_VAL], idx[SAMPLES - N_VAL :]


def _read_shipped() -> Optional[tuple[np.ndarray, np.ndarray]]:
    spec = importlib.util.find_spec("sklearn")  # (finds the package; runs none of it)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")
    if not os.path.isfile(path):
        return None
    data = np.loadtxt(path, delimiter=",")  # (as sklearn.datasets.load_digits reads it)
    if data.shape != (SAMPLES, 65):
        return None
    x = data[:, :-1].astype(np.uint8).reshape(-1, 1, 8, 8)
    return x, data[:, -1].astype(np.int64)


def _through_sklearn(val_fraction: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = x.astype(np.uint8).reshape(-1, 1, 8, 8)
    xtr, xva, ytr, yva = train_test_split(x, y, test_size=val_fraction, random_state=0, stratify=y)
    return xtr, xva, ytr.astype(np.int64), yva.astype(np.int64)


def _record() -> str:
    """The SPLIT constant, from scikit-learn (run once: `python -m tuner.trial.loop.digits`)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    _, y = load_digits(return_X_y=True)
    train, val, _, _ = train_test_split(
        np.arange(SAMPLES), y, test_size=RECORDED_VAL_FRACTION, random_state=0, stratify=y
    )
    assert len(val) == N_VAL
    return base64.b64encode(np.concatenate([train, val]).astype("<u2").tobytes()).decode()


if __name__ == "__main__":
    print(_record())
