"""Where the test suite's time goes: the per-test records of `REPROCUBE_TEST_CPU=FILE make test`
(tests/conftest.py), summed per test file, the files with the most CPU first, then the costliest tests.

    REPROCUBE_TEST_CPU=/tmp/cpu.jsonl make test
    .venv/bin/python benchmarks/test_suite_cpu.py /tmp/cpu.jsonl [--tests 25]

CPU is the worker's and the children's it waited for: Docker's and SLURM's processes are not in it."""

from __future__ import annotations

import argparse
import collections
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records")
    parser.add_argument("--tests", type=int, default=25, help="how many of the costliest tests to list")
    args = parser.parse_args()
    with open(args.records) as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    files = collections.defaultdict(lambda: [0.0, 0.0, 0])
    for record in records:
        total = files[record["id"].split("::")[0]]
        total[0] += record["cpu_s"]
        total[1] += record["wall_s"]
        total[2] += 1
    cpu, wall = sum(r["cpu_s"] for r in records), sum(r["wall_s"] for r in records)
    print(f"{len(records)} tests: {cpu:.0f} CPU s, {wall:.0f} s of test wall time (summed over the workers)")
    print(f"{'CPU s':>8} {'wall s':>8} {'tests':>5}  file")
    for name, (file_cpu, file_wall, count) in sorted(files.items(), key=lambda item: -item[1][0]):
        print(f"{file_cpu:8.1f} {file_wall:8.1f} {count:5d}  {name}")
    print(f"\nthe {args.tests} costliest tests (CPU s, wall s):")
    for record in sorted(records, key=lambda r: -r["cpu_s"])[: args.tests]:
        print(f"{record['cpu_s']:8.1f} {record['wall_s']:8.1f}  {record['id']}")


if __name__ == "__main__":
    main()
