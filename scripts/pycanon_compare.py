#!/usr/bin/env python3
"""Compare cloakd's release report with pycanon's measures on the same release.

Runs `cloakd table anonymize` on a job (Adult by default), reads the released CSV back and lets
pycanon (https://github.com/IFCA-Advanced-Computing/pycanon) measure k-anonymity, distinct and
entropy l-diversity, t-closeness and delta-disclosure on it, with the released QI columns as the
quasi-identifiers and the sensitive column as the sensitive attribute; then prints both side by side
and exits 1 if any measure disagrees beyond the documented differences of definition:

- entropy l: pycanon returns int(min_E exp(H(E))), cloakd the real number; compared after flooring.
- t: pycanon uses the equal-distance EMD for a string sensitive attribute and the ordered EMD for a
  numeric one, as cloakd's `t_emd` does; compared to 1e-9.
- delta: pycanon skips the values a class lacks (|log 0| is left out), cloakd reports the release as
  unbounded (JSON null) when some class lacks a value of the table; compared only when cloakd's is
  finite, else reported.

Usage (from the repository root, pycanon installed: `pip install pycanon`):
    cargo build --release
    python3 scripts/pycanon_compare.py --cloakd target/release/cloakd --job examples/adult.toml \
        --k 10 [--l distinct:2] [--algorithm ola] [any other `cloakd table anonymize` flag]
"""
import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
from pycanon import anonymity


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cloakd", required=True, help="the cloakd binary")
    parser.add_argument("--job", required=True, help="the job TOML")
    parser.add_argument("--sensitive", default="occupation", help="the sensitive column")
    parser.add_argument("--input", help="input CSV overriding the job's")
    # Every other argument is passed on to `cloakd table anonymize` in order (--k 10 --l distinct:2).
    args, flags = parser.parse_known_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "release.csv"
        report_path = Path(tmp) / "report.json"
        command = [args.cloakd, "table", "anonymize", args.job, "--output", str(out),
                   "--report", str(report_path)]
        if args.input:
            command += ["--input", args.input]
        command += flags
        print("$", " ".join(command), file=sys.stderr)
        subprocess.run(command, check=True)
        report = json.loads(report_path.read_text())
        if report["release"] != "generalization":
            print("only generalized releases are compared", file=sys.stderr)
            return 2
        data = pd.read_csv(out, dtype=str, keep_default_na=False)
    sensitive = args.sensitive
    quasi = [c for c in data.columns if c != sensitive]
    started = time.monotonic()
    ours = {
        "k": anonymity.k_anonymity(data, quasi),
        "l_distinct": anonymity.l_diversity(data, quasi, [sensitive]),
        "l_entropy (floor)": anonymity.entropy_l_diversity(data, quasi, [sensitive]),
        "t_emd": anonymity.t_closeness(data, quasi, [sensitive]),
        "delta (present values)": anonymity.delta_disclosure(data, quasi, [sensitive]),
    }
    seconds = time.monotonic() - started
    theirs = {
        "k": report["k"],
        "l_distinct": report["l_distinct"],
        "l_entropy (floor)": math.floor(report["l_entropy"] + 1e-9),
        "t_emd": report["t_emd"],
        "delta (present values)": report["delta"],
    }
    failures = 0
    print(f"release: {report['rows']} rows, {report['classes']} classes, "
          f"algorithm {report.get('algorithm', '?')}; pycanon took {seconds:.1f} s")
    print(f"{'measure':<24} {'cloakd':>14} {'pycanon':>14}  agree")
    for name, value in ours.items():
        mine = theirs[name]
        if mine is None:
            agree = "n/a (cloakd: unbounded, a class lacks a value)"
        elif isinstance(mine, float) or isinstance(value, float):
            ok = abs(float(mine) - float(value)) <= 1e-9
            agree = "yes" if ok else "NO"
            failures += not ok
        else:
            ok = int(mine) == int(value)
            agree = "yes" if ok else "NO"
            failures += not ok
        shown = "null" if mine is None else f"{float(mine):.6g}"
        print(f"{name:<24} {shown:>14} {float(value):>14.6g}  {agree}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
