#!/usr/bin/env python3
"""Prints "N passed, N failed[, N skipped]" from lit's xunit XML.

Exits 1 when any test failed or no test ran at all.
"""
import sys
import xml.etree.ElementTree as ET


def main(path: str) -> int:
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
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
