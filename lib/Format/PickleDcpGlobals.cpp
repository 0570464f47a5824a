//===- PickleDcpGlobals.cpp - The globals a DCP pickle may name -----------===//
//
// isDcpGlobal, the reader's default allow-list (Pickle.h): the classes and
// functions PyTorch's DCP metadata and torch.save items refer to. Any other
// global is refused when the reader meets it.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/Pickle.h"

#include <initializer_list>

namespace fsdp {
namespace pickle {

bool isDcpGlobal(std::string_view module, std::string_view name) {
  auto oneOf = [&](std::initializer_list<std::string_view> names) {
    for (std::string_view n : names)
      if (n == name)
        return true;
    return false;
  };
  if (module == "torch.distributed.checkpoint.metadata")
    return oneOf({"Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                  "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING",
                  "MetadataIndex", "StorageMeta"});
  if (module == "torch.distributed._shard.sharded_tensor.metadata")
    return oneOf({"TensorProperties", "MEM_FORMAT_ENCODING"});
  if (module == "torch.distributed.checkpoint.filesystem")
    return name == "_StorageInfo";
  if (module == "torch")
    return oneOf({// containers and layouts
                  "Size", "strided", "contiguous_format", "channels_last", "channels_last_3d",
                  "preserve_format",
                  // dtypes
                  "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8",
                  "uint8", "bool", "complex32", "complex64", "complex128", "float8_e4m3fn",
                  "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "uint16",
                  "uint32", "uint64",
                  // storages
                  "UntypedStorage", "DoubleStorage", "FloatStorage", "HalfStorage",
                  "BFloat16Storage", "LongStorage", "IntStorage", "ShortStorage", "CharStorage",
                  "ByteStorage", "BoolStorage", "ComplexFloatStorage", "ComplexDoubleStorage"});
  if (module == "torch.serialization")
    return name == "_get_layout";
  if (module == "torch._utils")
    return oneOf(
        {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_parameter"});
  if (module == "collections")
    return name == "OrderedDict";
  if (module == "pathlib" || module == "pathlib._local")
    return oneOf({"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"});
  return false;
}

} // namespace pickle
} // namespace fsdp
