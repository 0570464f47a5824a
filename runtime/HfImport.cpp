//===- HfImport.cpp - Load a Hugging Face model into a plan's layout ------===//
#include "fsdp/Runtime/HfImport.h"

#include "Loader.h"
#include "Parallel.h"
#include "RuntimeSupport.h"
#include "fsdp/Format/FileName.h"
#include "fsdp/Layout/Overlap.h"
#include "fsdp/Runtime/Cast.h"
#include "fsdp/Runtime/Protocol.h"
#include "fsdp/Support/Printable.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <set>
#include <tuple>

namespace fsdp {
namespace runtime {

std::string HfModel::pathOf(const std::string &name) const {
  return printable(dir_ + "/" + name);
}

namespace {

/// An absolute path with `.`, `..` and repeated slashes taken out, by its
/// text alone (no link is looked at).
std::string lexicallyNormal(const std::string &path) {
  std::vector<std::string> parts;
  for (size_t begin = 0; begin <= path.size();) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos)
      end = path.size();
    std::string part = path.substr(begin, end - begin);
    if (part == "..") {
      if (!parts.empty())
        parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    begin = end + 1;
  }
  std::string out;
  for (const std::string &part : parts)
    out += "/" + part;
  return out.empty() ? "/" : out;
}

const char *notRegularText(PathStatus::Kind kind) {
  switch (kind) {
  case PathStatus::Kind::Missing:
    return "missing";
  case PathStatus::Kind::Directory:
    return "a directory";
  case PathStatus::Kind::Link:
    return "itself a symbolic link";
  default:
    return "not a regular file (a FIFO, a socket or a device)";
  }
}

} // namespace

Result<HfDirectory> HfDirectory::open(const std::string &dir, Storage &storage) {
  Result<PathStatus> where = storage.status(dir);
  if (!where)
    return where.failure();
  if (where->kind == PathStatus::Kind::Link) {
    Result<std::string> real = storage.realPath(dir);
    if (!real)
      return real.failure();
    where = storage.status(*real);
    if (!where)
      return where.failure();
  }
  if (where->kind != PathStatus::Kind::Directory)
    return makeError(printable(dir) + ": " +
                         (where->kind == PathStatus::Kind::Missing ? "no such directory"
                                                                   : "not a directory"),
                     where->kind == PathStatus::Kind::Missing ? ErrorKind::NotFound
                                                              : ErrorKind::InvalidArgument);
  HfDirectory out;
  out.dir = trimSlashes(dir);
  Result<std::string> realDir = storage.realPath(out.dir);
  if (!realDir)
    return realDir.failure();
  out.realDir = *realDir;
  // A hub snapshot: <repo>/snapshots/<rev>, with <repo>/blobs a directory.
  if (baseName(parentDir(out.realDir)) == "snapshots") {
    std::string repo = parentDir(parentDir(out.realDir));
    std::string blobs = repo == "/" ? "/blobs" : repo + "/blobs";
    Result<PathStatus> found = storage.status(blobs);
    if (!found)
      return found.failure();
    if (found->kind == PathStatus::Kind::Directory)
      out.blobs = blobs;
  }
  return out;
}

Result<std::string> HfDirectory::sourcePath(const std::string &name, Storage &storage) const {
  std::string path = dir + "/" + name;
  Result<PathStatus> where = storage.status(path);
  if (!where)
    return where.failure();
  if (where->kind != PathStatus::Kind::Link)
    return path; // openRead refuses what is not a regular file
  Result<std::string> target = storage.readLink(path);
  if (!target)
    return target.failure();
  std::string link = printable(path) + " -> " + printable(*target);
  Result<std::string> real = storage.realPath(path);
  if (!real)
    return makeError(link + ": the link leads to nothing that can be opened (" +
                         printable(real.error()) + ")",
                     real.failure().kind);
  // A link within the directory: FileSource follows it (and checks it again).
  if (real->compare(0, realDir.size() + 1, realDir + "/") == 0)
    return path;
  if (blobs.empty())
    return makeError(link + ": a symbolic link out of the model directory (to " +
                         printable(*real) +
                         "); refused: only a Hugging Face hub snapshot's links into its blobs/ "
                         "are followed",
                     ErrorKind::InvalidArgument);
  // A hub snapshot: huggingface_hub links each file straight to its blob
  // (../../blobs/<hash>); a link chain or any other place is refused.
  std::string hop =
      lexicallyNormal(!target->empty() && (*target)[0] == '/' ? *target : realDir + "/" + *target);
  std::string refused = link + ": refused: a hub snapshot's links are followed only straight to "
                               "a regular file in " +
                        printable(blobs);
  if (parentDir(hop) != blobs)
    return makeError(refused + (parentDir(*real) == blobs
                                    ? ", not through other links (it reaches " +
                                          printable(*real) + ")"
                                    : ", and this one leads to " + printable(*real)),
                     ErrorKind::InvalidArgument);
  Result<PathStatus> blob = storage.status(hop);
  if (!blob)
    return blob.failure();
  if (blob->kind != PathStatus::Kind::RegularFile)
    return makeError(refused + "; the blob " + printable(hop) + " is " + notRegularText(blob->kind),
                     ErrorKind::InvalidArgument);
  if (hop != *real) // a link along the way (the blob itself is none)
    return makeError(refused + ", not through other links (it reaches " + printable(*real) + ")",
                     ErrorKind::InvalidArgument);
  return hop;
}

Status HfModel::openFile(const std::string &name, Storage &storage) {
  if (files_.count(name))
    return Status::success();
  Result<std::string> path = where_.sourcePath(name, storage);
  if (!path)
    return path.failure();
  Result<std::unique_ptr<zip::ByteSource>> file = storage.openRead(*path);
  if (!file)
    return file.failure();
  const zip::ByteSource &source = **file;
  char prefix[8] = {};
  if (source.size() >= 8)
    if (Status status = source.read(0, prefix, 8); !status)
      return status;
  Result<uint64_t> length = safetensors::headerLength(prefix, source.size());
  if (!length)
    return propagate(length, pathOf(name) + ": " + length.error());
  // Bounded by the file's size and kMaxHeaderBytes before it is allocated.
  std::string json(*length, '\0');
  if (Status status = source.read(8, json.data(), json.size()); !status)
    return status;
  headerBytes_ += 8 + json.size();
  Result<safetensors::FileHeader> header = safetensors::parseHeader(json, source.size());
  if (!header)
    return propagate(header, pathOf(name) + ": " + header.error());
  headers_[name] = header.take();
  files_[name] = file.take();
  return Status::success();
}

Result<std::unique_ptr<HfModel>> HfModel::open(const std::string &dir, Storage &storage) {
  Result<HfDirectory> where = HfDirectory::open(dir, storage);
  if (!where)
    return where.failure();
  std::unique_ptr<HfModel> model(new HfModel(where.take()));
  std::string indexPath = model->dir_ + "/" + kHfIndexFile;
  if (storage.exists(indexPath)) {
    Result<std::string> indexSource = model->where_.sourcePath(kHfIndexFile, storage);
    if (!indexSource)
      return indexSource.failure();
    Result<std::unique_ptr<zip::ByteSource>> index = storage.openRead(*indexSource);
    if (!index)
      return index.failure();
    if ((*index)->size() > safetensors::kMaxIndexBytes)
      return makeError(printable(indexPath) + ": " + std::to_string((*index)->size()) +
                           " bytes, more than the " +
                           std::to_string(safetensors::kMaxIndexBytes) + " an index may be",
                       ErrorKind::Corrupt);
    std::string json((*index)->size(), '\0');
    if (Status status = (*index)->read(0, json.data(), json.size()); !status)
      return status.failure();
    model->headerBytes_ += json.size();
    Result<std::map<std::string, std::string>> weights = safetensors::parseIndex(json);
    if (!weights)
      return propagate(weights, printable(indexPath) + ": " + weights.error());
    // Each file's tensors by name, as the index finds them.
    std::map<std::string, std::map<std::string, const safetensors::TensorEntry *>> byFile;
    for (const auto &[name, file] : *weights) {
      if (!byFile.count(file)) {
        if (Status status = model->openFile(file, storage); !status)
          return status.failure();
        for (const safetensors::TensorEntry &entry : model->headers_[file].tensors)
          byFile[file][entry.name] = &entry;
      }
      auto entry = byFile[file].find(name);
      if (entry == byFile[file].end())
        return makeError(printable(indexPath) + " puts '" + printable(name) + "' in " +
                             printable(file) + ", which does not hold it",
                         ErrorKind::Corrupt);
      model->tensors_[name] = {file, *entry->second};
    }
    return model;
  }
  if (!storage.exists(model->dir_ + "/" + kHfSingleFile))
    return makeError(printable(dir) + " holds neither " + kHfSingleFile + " nor " + kHfIndexFile +
                         " (not a Hugging Face model directory)",
                     ErrorKind::NotFound);
  if (Status status = model->openFile(kHfSingleFile, storage); !status)
    return status.failure();
  for (const safetensors::TensorEntry &entry : model->headers_[kHfSingleFile].tensors)
    model->tensors_[entry.name] = {kHfSingleFile, entry};
  return model;
}

const HfTensor *HfModel::find(const std::string &name) const {
  auto found = tensors_.find(name);
  return found == tensors_.end() ? nullptr : &found->second;
}

Status HfModel::read(const HfTensor &tensor, uint64_t offset, uint64_t count, char *out) const {
  auto file = files_.find(tensor.file);
  if (file == files_.end() || offset > tensor.entry.bytes || count > tensor.entry.bytes - offset)
    return makeError(tensor.entry.name + ": a read outside the tensor", ErrorKind::Internal);
  return file->second->read(tensor.entry.begin + offset, out, count);
}

std::string HfKeyMap::fqnOf(const std::string &name) const {
  if (auto found = names.find(name); found != names.end())
    return found->second;
  for (const auto &[prefix, replacement] : prefixes)
    if (name.compare(0, prefix.size(), prefix) == 0)
      return replacement + name.substr(prefix.size());
  return name;
}

namespace {

constexpr const char *kModelPrefix = "model.";

bool castable(dcp::DType from, dcp::DType to) {
  auto floating = [](dcp::DType dtype) {
    return dtype == dcp::DType::Float64 || dtype == dcp::DType::Float32 ||
           dtype == dcp::DType::BFloat16 || dtype == dcp::DType::Float16;
  };
  return from == to || (floating(from) && floating(to));
}

/// One piece of this rank's plan and where its values come from.
struct Piece {
  const plan::ReadItem *read = nullptr;
  const HfTensor *source = nullptr; // null: optimizer state, zeroed
  std::vector<layout::CopyRun> runs;
  uint64_t bytes = 0; // of the piece, in the buffer's dtype
};

/// The FQNs naming the same memory as `read` (tied parameters): the keys
/// of this rank's writes of the same piece.
std::vector<std::string> tiedNames(const plan::RankPlan &plan, const plan::ReadItem &read) {
  std::vector<std::string> names;
  for (const plan::WriteItem &write : plan.writes)
    if (write.source == plan::ItemSource::Buffer && write.key != read.key &&
        write.key.rfind(kModelPrefix, 0) == 0 && write.buffer.group == read.buffer.group &&
        write.buffer.role == read.buffer.role &&
        write.buffer.localOffset == read.buffer.localOffset &&
        write.chunkOffsets == read.chunkOffsets)
      names.push_back(write.key.substr(6));
  return names;
}

/// Which of `model`'s tensors each FQN takes its values from.
Result<std::map<std::string, const HfTensor *>> byFqn(const HfModel &model,
                                                      const HfKeyMap &keyMap) {
  std::map<std::string, const HfTensor *> out;
  for (const auto &[name, tensor] : model.tensors()) {
    std::string fqn = keyMap.fqnOf(name);
    if (fqn.empty())
      continue;
    auto [at, added] = out.emplace(fqn, &tensor);
    if (!added)
      return makeError("the key map gives '" + printable(at->second->entry.name) + "' and '" +
                           printable(name) + "' of " + printable(model.dir()) +
                           " the same FQN '" + printable(fqn) + "'",
                       ErrorKind::InvalidArgument);
  }
  return out;
}

/// Every piece of this rank's plan, checked against the files before any
/// data is read.
Result<std::vector<Piece>> planPieces(const plan::RankPlan &plan, const HfModel &model,
                                      const std::map<std::string, const HfTensor *> &sources,
                                      const RankBuffers &buffers) {
  std::vector<Piece> pieces;
  for (const plan::ReadItem &read : plan.reads) {
    if (read.source != plan::ItemSource::Buffer)
      continue;
    Piece piece;
    piece.read = &read;
    if (Result<BufferView> view = pieceBuffer(read, buffers); !view)
      return view.failure();
    piece.bytes =
        static_cast<uint64_t>(read.buffer.elements) * dcp::dtypeInfo(read.dtype).elementSize;
    if (read.key.rfind(kModelPrefix, 0) == 0) {
      std::string fqn = read.key.substr(6);
      auto found = sources.find(fqn);
      for (const std::string &tied : tiedNames(plan, read))
        if (found == sources.end())
          found = sources.find(tied);
      if (found == sources.end())
        return incompatible(read.key + ": " + printable(model.dir()) + " has no tensor '" +
                            printable(fqn) + "' (" + std::to_string(model.tensors().size()) +
                            " tensors there; a key map renames them)");
      const HfTensor &source = *found->second;
      const safetensors::TensorEntry &entry = source.entry;
      std::string where = "'" + printable(entry.name) + "' in " + model.pathOf(source.file);
      if (entry.shape != read.globalShape)
        return incompatible(read.key + ": " + where + " has shape " + dimsText(entry.shape) +
                            ", the plan expects " + dimsText(read.globalShape));
      if (!castable(entry.dtype, read.dtype))
        return incompatible(read.key + ": " + where + " is " +
                            dcp::dtypeInfo(entry.dtype).name + ", which does not cast to the " +
                            dcp::dtypeInfo(read.dtype).name + " main weights");
      piece.source = &source;
      layout::Box whole{dcp::Dims(entry.shape.size(), 0), entry.shape};
      layout::overlapRuns(whole, {read.chunkOffsets, read.chunkSizes}, piece.runs);
      int64_t covered = 0;
      for (const layout::CopyRun &run : piece.runs)
        covered += run.count;
      if (covered != read.buffer.elements)
        return makeError(read.key + ": the plan's piece is not a box of the tensor",
                         ErrorKind::InvalidArgument);
    }
    pieces.push_back(std::move(piece));
  }
  // In the order the bytes lie in the files (zeroed pieces first), so each
  // file is read front to back.
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece &a, const Piece &b) {
    auto at = [](const Piece &p) {
      return p.source ? std::make_tuple(1, p.source->file,
                                        p.source->entry.begin +
                                            (p.runs.empty() ? 0 : p.runs[0].srcElementOffset))
                      : std::make_tuple(0, std::string(), uint64_t(0));
    };
    return at(a) < at(b);
  });
  return pieces;
}

/// Reads (and casts) one piece into its buffer, in blocks of at most
/// `blockBytes` of the file's dtype; zeroes a piece without a source.
Status loadPiece(const HfModel &model, const Piece &piece, const RankBuffers &buffers,
                 uint64_t blockBytes, std::string &fileBlock, std::string &castBlock) {
  const plan::ReadItem &read = *piece.read;
  Result<BufferView> view = buffers.get(read.buffer.group, read.buffer.role);
  if (!view)
    return view.failure();
  uint64_t toSize = dcp::dtypeInfo(read.dtype).elementSize;
  uint64_t pieceOffset = static_cast<uint64_t>(read.buffer.localOffset) * toSize;
  bool host = view->backend->hostAccessible();
  char *base = static_cast<char *>(view->data) + pieceOffset;
  if (!piece.source) {
    if (host) {
      std::memset(base, 0, piece.bytes);
      return Status::success();
    }
    castBlock.assign(std::min(piece.bytes, blockBytes), '\0');
    for (uint64_t at = 0; at < piece.bytes; at += castBlock.size())
      if (Status status = view->copyIn(pieceOffset + at,
                                       std::min<uint64_t>(castBlock.size(), piece.bytes - at),
                                       castBlock.data());
          !status)
        return status;
    return Status::success();
  }
  dcp::DType from = piece.source->entry.dtype;
  uint64_t fromSize = dcp::dtypeInfo(from).elementSize;
  uint64_t blockElements = std::max<uint64_t>(1, blockBytes / std::max(fromSize, toSize));
  for (const layout::CopyRun &run : piece.runs) {
    for (uint64_t done = 0; done < static_cast<uint64_t>(run.count);) {
      uint64_t count = std::min(blockElements, static_cast<uint64_t>(run.count) - done);
      uint64_t dst = (static_cast<uint64_t>(run.dstElementOffset) + done) * toSize;
      uint64_t src = (static_cast<uint64_t>(run.srcElementOffset) + done) * fromSize;
      // Same dtype into host memory: straight into the buffer.
      char *into = host && from == read.dtype ? base + dst : nullptr;
      if (!into) {
        fileBlock.resize(count * fromSize);
        into = fileBlock.data();
      }
      if (Status status = model.read(*piece.source, src, count * fromSize, into); !status)
        return propagate(status, read.key + ": " + status.error());
      if (into != base + dst) {
        char *cast = host ? base + dst : nullptr;
        if (!cast) {
          castBlock.resize(count * toSize);
          cast = castBlock.data();
        }
        if (Status status = castElements(from, into, read.dtype, cast, count); !status)
          return propagate(status, read.key + ": " + status.error());
        if (!host)
          if (Status status = view->copyIn(pieceOffset + dst, count * toSize, cast); !status)
            return propagate(status, read.key + ": " + status.error());
      }
      done += count;
    }
  }
  return Status::success();
}

/// The committing rank's note of the files' tensors no planned key uses.
std::string unusedNote(const HfModel &model, const std::map<std::string, const HfTensor *> &sources,
                       const std::vector<std::string> &planned) {
  std::vector<std::string> unused;
  for (const auto &[fqn, tensor] : sources)
    if (!std::binary_search(planned.begin(), planned.end(), kModelPrefix + fqn))
      unused.push_back(tensor->entry.name);
  if (unused.empty())
    return {};
  std::string note = std::to_string(unused.size()) + " tensor" + (unused.size() == 1 ? "" : "s") +
                     " of " + printable(model.dir()) + " not in the plan, not loaded:";
  for (size_t i = 0; i < unused.size() && i < 8; ++i)
    note += " " + printable(unused[i]);
  if (unused.size() > 8)
    note += " ...";
  return note;
}

} // namespace

Result<LoadResult> loadHuggingFace(const plan::RankPlan &plan, RankBuffers &buffers,
                                   const std::string &dir, Communicator &comm, Storage &storage,
                                   const HfLoadOptions &options) {
  auto start = std::chrono::steady_clock::now();
  LoadResult result;
  uint64_t storageBytes = 0, bytesRead = 0;
  Status status = Status::success();
  try {
    Result<std::unique_ptr<HfModel>> model = HfModel::open(dir, storage);
    Result<std::map<std::string, const HfTensor *>> sources =
        model ? byFqn(**model, options.keyMap)
              : Result<std::map<std::string, const HfTensor *>>(model.failure());
    Result<std::vector<Piece>> pieces =
        sources ? planPieces(plan, **model, *sources, buffers)
                : Result<std::vector<Piece>>(sources.failure());
    if (!pieces) {
      status = pieces.failure();
    } else {
      storageBytes = (*model)->headerBytes();
      if (options.notice && options.plannedKeys && comm.rank() == options.root) {
        Result<const std::vector<std::string> *> planned = options.plannedKeys();
        if (planned && *planned)
          if (std::string note = unusedNote(**model, *sources, **planned); !note.empty())
            options.notice(note);
      }
      unsigned threads = options.threads ? options.threads : defaultThreads();
      uint64_t blockBytes =
          options.stagingBytes ? options.stagingBytes : defaultStagingBytes(threads) / threads;
      uint64_t total = 0;
      for (const Piece &piece : *pieces)
        total += piece.source ? piece.bytes : 0;
      ProgressReporter progress(options.progress, total);
      std::vector<std::string> fileBlocks(threads), castBlocks(threads);
      std::atomic<uint64_t> done{0};
      status = forEachItem(pieces->size(), threads, [&](size_t index, unsigned worker) {
        const Piece &piece = (*pieces)[index];
        if (Status loaded = loadPiece(**model, piece, buffers, blockBytes, fileBlocks[worker],
                                      castBlocks[worker]);
            !loaded)
          return loaded;
        if (!piece.source)
          return Status::success();
        return progress.reached(done += piece.bytes);
      });
      bytesRead = done.load();
      for (const Piece &piece : *pieces)
        for (const layout::CopyRun &run : piece.runs)
          storageBytes += static_cast<uint64_t>(run.count) *
                         dcp::dtypeInfo(piece.source->entry.dtype).elementSize;
    }
  } catch (const std::bad_alloc &) {
    status = makeError("out of memory while reading " + printable(trimSlashes(dir)), ErrorKind::IO,
                       ENOMEM);
  }
  if (status && options.syncModelWeights)
    status = refreshModelWeights(plan, buffers);
  if (Status agreed = agree(comm, status, options.root); !agreed)
    return propagate(agreed, "load of the Hugging Face model " + printable(trimSlashes(dir)) +
                                 " failed: " + agreed.error());
  for (const plan::ReadItem &read : plan.reads) {
    result.stats.items += read.source == plan::ItemSource::Buffer;
    if (read.source == plan::ItemSource::Step)
      result.step = 0.0f;
  }
  result.stats.bytes = bytesRead;
  result.stats.bytesReadStorage = storageBytes; // the headers, then every byte of the pieces
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.stats.stallSeconds = result.stats.seconds;
  return result;
}

} // namespace runtime
} // namespace fsdp
