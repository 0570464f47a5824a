//===- FuzzZip.cpp - libFuzzer target: zip reader and torch.save items ----===//
//
// Any input as an archive: directory parsing, entry reads, CRC checks, the
// torch.save item view and the tensor copy must fail cleanly or succeed
// within bounds. The first bytes also drive the writer: planned archives
// must read back with the same names and contents.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/Zip.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void readAsArchive(std::string_view bytes) {
  using namespace fsdp::zip;
  MemorySource source(bytes);
  auto entries = readDirectory(source);
  if (entries)
    for (const Entry &entry : *entries) {
      (void)readEntry(source, entry, 1 << 20);
      (void)verifyEntryCrc(source, entry);
    }
  auto item = openTorchSaveItem(source);
  if (!item)
    return;
  auto record = decodeTensorPickle(item->dataPkl);
  if (!record)
    return;
  const Entry *data = item->findRecord("data/" + record->storageKey);
  uint64_t outBytes =
      record->elementCount() * fsdp::dcp::dtypeInfo(record->dtype).elementSize;
  if (!data || data->size > (1u << 20) || outBytes > (1u << 20))
    return;
  auto storage = readEntry(source, *data, 1 << 20, /*verifyCrc=*/false);
  if (!storage)
    return;
  std::vector<char> out(static_cast<size_t>(outBytes));
  (void)copyToContiguous(*record, storage->data(), storage->size(), out.data(),
                         item->bigEndian);
}

/// Records cut from the input: [count][name length, data length, name, data]...
void writeThenRead(std::string_view bytes) {
  using namespace fsdp::zip;
  if (bytes.empty())
    return;
  size_t count = static_cast<uint8_t>(bytes[0]) % 8;
  size_t pos = 1;
  std::vector<RecordSpec> records;
  for (size_t i = 0; i < count && pos + 2 <= bytes.size(); ++i) {
    size_t nameSize = 1 + static_cast<uint8_t>(bytes[pos]) % 32;
    size_t dataSize = static_cast<uint8_t>(bytes[pos + 1]);
    pos += 2;
    if (pos + nameSize + dataSize > bytes.size())
      break;
    RecordSpec record;
    record.name = std::string(bytes.substr(pos, nameSize));
    record.bytes = std::string(bytes.substr(pos + nameSize, dataSize));
    pos += nameSize + dataSize;
    records.push_back(std::move(record));
  }
  auto layout = planArchive(records);
  if (!layout)
    return;
  MemorySource source(layout->header);
  auto entries = readDirectory(source);
  if (!entries || entries->size() != records.size()) {
    std::fprintf(stderr, "planned archive does not read back\n");
    std::abort();
  }
  for (size_t i = 0; i < records.size(); ++i) {
    auto contents = readEntry(source, (*entries)[i]);
    if ((*entries)[i].name != records[i].name || !contents ||
        *contents != records[i].bytes || (*entries)[i].dataOffset % 64 != 0) {
      std::fprintf(stderr, "planned archive record %zu differs\n", i);
      std::abort();
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char *>(data), size);
  readAsArchive(bytes);
  writeThenRead(bytes);
  return 0;
}
