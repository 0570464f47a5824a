#!/usr/bin/env python3
"""Prints "N passed, N failed[, N skipped]" from lit's xunit XML, plus the
fuzzers' results file ("<fuzzer> pass|fail" per line) when given.

Exits 1 when any test failed or no test ran at all.
"""
import sys
import xml.etree.ElementTree as ET


def main(path: str, extra: str = "") -> int:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as error:
        print(f"summarize_tests: cannot read {path}: {error}", file=sys.stderr)
        print("0 passed, 1 failed")
        return 1
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None:
            skipped += 1
        else:
            passed += 1
    if extra:
        try:
            for result in open(extra):
                name, _, outcome = result.strip().partition(" ")
                if outcome == "pass":
                    passed += 1
                elif name:
                    failed += 1
        except OSError:
            print(f"summarize_tests: no fuzzer results in {extra}", file=sys.stderr)
            failed += 1
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
