//===- FuzzPickle.cpp - libFuzzer target: restricted unpickler ------------===//
//
// Any input: the reader, repr, writer, DCP metadata conversion and the tensor
// data.pkl decoder must return an error or a value, never crash, hang or
// allocate beyond a multiple of the input. Whatever parses as DCP metadata
// must re-serialize and parse back equal.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/DcpMetadata.h"
#include "fsdp/Format/Pickle.h"
#include "fsdp/Format/Zip.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char *>(data), size);

  auto doc = fsdp::pickle::read(bytes);
  if (doc) {
    (void)fsdp::pickle::toPythonRepr(*doc->root());
    fsdp::pickle::Writer writer;
    if (writer.writeValue(*doc->root()))
      (void)writer.finish();
    auto metadata = fsdp::dcp::metadataFromPickle(*doc->root());
    if (metadata) {
      auto again = fsdp::dcp::serializeMetadata(*metadata);
      if (!again) {
        std::fprintf(stderr, "parsed metadata does not serialize: %s\n",
                     again.error().c_str());
        std::abort();
      }
      auto back = fsdp::dcp::parseMetadata(*again);
      if (!back || !(*back == *metadata)) {
        std::fprintf(stderr, "metadata round trip differs\n");
        std::abort();
      }
    }
  }

  auto record = fsdp::zip::decodeTensorPickle(bytes);
  if (record) {
    // A decoded record re-encodes and decodes to the same view.
    auto pkl = fsdp::zip::encodeTensorPickle(*record);
    auto back = pkl ? fsdp::zip::decodeTensorPickle(*pkl) : decltype(record)(fsdp::Error{"x"});
    if (!back || back->size != record->size || back->stride != record->stride ||
        back->storageOffset != record->storageOffset || back->dtype != record->dtype ||
        back->storageElements != record->storageElements) {
      std::fprintf(stderr, "tensor pickle round trip differs\n");
      std::abort();
    }
  }
  return 0;
}
