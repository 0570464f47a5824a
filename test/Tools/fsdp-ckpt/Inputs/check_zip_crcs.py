"""Checks every item archive in a checkpoint's data files with Python's zipfile:
each CRC-32 against its record's bytes (testzip). Prints the archives, records and
largest record checked; exits 1 naming the first record that does not match."""
import io
import os
import re
import sys
import zipfile

checked = records = largest = 0
for name in sorted(os.listdir(sys.argv[1])):
    if not name.endswith(".distcp"):
        continue
    data = open(os.path.join(sys.argv[1], name), "rb").read()
    starts = [m.start() for m in re.finditer(rb"PK\x03\x04", data)]
    previous_end = -1
    # Each item is one archive: its first local header after the last archive's end
    # record, up to its own end record (22 bytes, no comment).
    for end in (m.start() for m in re.finditer(rb"PK\x05\x06", data)):
        start = min(s for s in starts if previous_end < s < end)
        archive = zipfile.ZipFile(io.BytesIO(data[start:end + 22]))
        bad = archive.testzip()
        if bad is not None:
            sys.exit(f"{name}: the archive at {start}: {bad}'s CRC does not match")
        checked += 1
        records += len(archive.infolist())
        largest = max([largest] + [i.file_size for i in archive.infolist()])
        previous_end = end
print(f"{checked} archives, {records} records, the largest {largest} bytes: every CRC matches")
