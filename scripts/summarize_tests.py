#!/usr/bin/env python3
"""Prints "N passed, N failed[, N skipped]" over every result file given:
JUnit XML (lit's xunit output, GoogleTest's --gtest_output=xml) and plain
result files with one "<name> pass|fail" line per test (the fuzzers, the
sanitizer round trip).

Exits 1 when any test failed, a result file is missing, or no test ran.
"""
import sys
import xml.etree.ElementTree as ET


def count_xml(path):
    passed = failed = skipped = 0
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def count_lines(path):
    passed = failed = 0
    for line in open(path):
        name, _, outcome = line.strip().partition(" ")
        if outcome == "pass":
            passed += 1
        elif name:
            failed += 1
    return passed, failed, 0


def main(paths):
    passed = failed = skipped = 0
    for path in paths:
        try:
            p, f, s = count_xml(path) if path.endswith(".xml") else count_lines(path)
        except (OSError, ET.ParseError) as error:
            print(f"summarize_tests: cannot read {path}: {error}", file=sys.stderr)
            p, f, s = 0, 1, 0
        passed, failed, skipped = passed + p, failed + f, skipped + s
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
