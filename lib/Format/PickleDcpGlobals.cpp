//===- PickleDcpGlobals.cpp - The globals a DCP pickle may name -----------===//
//
// isDcpGlobal, the reader's default allow-list (Pickle.h): the classes and
// functions PyTorch's DCP metadata and torch.save items refer to. Any other
// global is refused when the reader meets it.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/Pickle.h"
#include "fsdp/Format/DcpMetadata.h"

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
    // Containers and layouts; every dtype and legacy storage class of the
    // format's dtype table (DcpMetadata.cpp), and the untyped storage.
    return oneOf({"Size", "strided", "contiguous_format", "channels_last", "channels_last_3d",
                  "preserve_format", "UntypedStorage"}) ||
           dcp::findDType(name) || dcp::findDTypeByStorage(name);
  if (module == "torch.storage")
    // PyTorch 2.15 names the untyped storage by its defining module.
    return name == "UntypedStorage";
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
