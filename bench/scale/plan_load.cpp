//===- plan_load.cpp - How long one rank takes to plan a resharding load --===//
//
// At scale (a 405B-parameter model saved from 16,384 ranks: ~6 million
// chunks, a `.metadata` near 1 GB) the planning of a load, not its reading,
// is what a DCP checkpoint makes slow: every rank would parse all of
// `.metadata`. This program measures one rank's planning without writing
// any data, one JSON line per run:
//
//   fsdp-bench-plan-load build-index METADATA [--out FILE]
//     builds the chunk index of a `.metadata` alone (no item checksums) and
//     writes it (default: `.fsdp-chunks` beside METADATA);
//     {"bench":"chunk_index_build", metadata and index bytes, chunks,
//      parse and build seconds, peak RSS}
//   fsdp-bench-plan-load plan --dir D --plan P --rank R [--source auto|metadata]
//     opens D as a load does (through its chunk index when it has one, or
//     always through `.metadata`) and finds, for every read of rank R's
//     plan (P: a plan file, or a directory of per-rank plan files), the
//     saved chunks it needs;
//     {"bench":"reshard_plan","source":"chunk_index"|"metadata", reads,
//      overlaps, open / plan / total seconds, bytes the reader read, peak
//      RSS}
//   fsdp-bench-plan-load fill-checksums PLAN [--out-dir D]
//     the commit's side of a plan that carries the chunk index: inflates
//     `.metadata` and the index from PLAN (a committing rank's plan file)
//     and fills fake checksums into the index, as the commit does with the
//     gathered ones; {"bench":"commit_fill_checksums", records, seconds of
//     each step, the RSS before (the gathered items) and the peak of the
//     commit's part}; with --out-dir, writes the filled index and the
//     `.metadata` into D, as the commit would (a checkpoint without data,
//     for `plan`)
//
// Peak RSS is the process's (getrusage), so run one measurement per process.
//
//===----------------------------------------------------------------------===//

#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Plan/PlanFile.h"
#include "fsdp/Runtime/CheckpointReader.h"
#include "fsdp/Runtime/Storage.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <sys/stat.h>

using namespace fsdp;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double peakRssMiB() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss / 1024.0; // KiB on Linux
}

std::string number(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", value);
  return text;
}

int fail(const std::string &message) {
  std::cerr << "fsdp-bench-plan-load: " << message << "\n";
  return 1;
}

int usage() {
  return fail("usage: fsdp-bench-plan-load build-index METADATA [--out FILE]\n"
              "       fsdp-bench-plan-load plan --dir D --plan P --rank R "
              "[--source auto|metadata]\n"
              "       fsdp-bench-plan-load fill-checksums PLAN [--out-dir D]");
}

/// VmRSS or VmHWM of this process, MiB.
double statusMiB(const char *field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0)
      return std::stod(line.substr(std::strlen(field) + 1)) / 1024.0;
  return 0;
}

int fillChecksums(int argc, char **argv) {
  std::string outDir;
  if (argc == 3 && std::strcmp(argv[1], "--out-dir") == 0)
    outDir = argv[2];
  else if (argc != 1)
    return usage();
  Result<plan::PlanFile> plan = plan::PlanFile::open(argv[0]);
  if (!plan)
    return fail(plan.error());
  // The gathered items (the commit holds them already): one per record,
  // from the index itself, so nothing parses `.metadata`.
  std::vector<integrity::ItemChecksum> items;
  {
    Result<std::string> bytes = plan->chunkIndexBytes();
    if (!bytes)
      return fail(bytes.error());
    if (bytes->empty())
      return fail(std::string(argv[0]) + ": the plan has no chunk index");
    Result<std::unique_ptr<chunkindex::ChunkIndex>> index =
        chunkindex::ChunkIndex::fromBytes(bytes.take(), "index", true);
    if (!index)
      return fail(index.error());
    uint64_t digest = 1;
    for (uint64_t k = 0; k < (*index)->keyCount(); ++k) {
      std::string key = (*index)->key(k).name;
      Result<std::vector<chunkindex::Chunk>> chunks = (*index)->chunks(k);
      if (!chunks)
        return fail(chunks.error());
      for (const chunkindex::Chunk &chunk : *chunks)
        items.push_back(
            {key, (*index)->fileName(chunk.file), chunk.itemOffset, chunk.itemLength, digest++});
    }
  }
  double itemsRss = statusMiB("VmRSS:");
  // The commit's part alone: its peak from here (VmHWM reset).
  std::ofstream("/proc/self/clear_refs") << "5";
  double start = now();
  Result<std::string> metadata = plan->metadataBytes();
  if (!metadata)
    return fail(metadata.error());
  double inflatedMetadata = now();
  uint64_t length = metadata->size(), xxh3 = integrity::xxh3(metadata->data(), length);
  double hashed = now();
  Result<std::string> index = plan->chunkIndexBytes();
  if (!index)
    return fail(index.error());
  double inflatedIndex = now();
  Result<bool> filled = chunkindex::fillChecksums(*index, items, length, xxh3);
  if (!filled || !*filled)
    return fail(filled ? "a bytes item changed size" : filled.error());
  double done = now();
  std::cout << "{\"bench\":\"commit_fill_checksums\",\"records\":" << items.size()
            << ",\"metadata_bytes\":" << length << ",\"index_bytes\":" << index->size()
            << ",\"inflate_metadata_seconds\":" << number(inflatedMetadata - start)
            << ",\"hash_metadata_seconds\":" << number(hashed - inflatedMetadata)
            << ",\"inflate_index_seconds\":" << number(inflatedIndex - hashed)
            << ",\"fill_seconds\":" << number(done - inflatedIndex)
            << ",\"total_seconds\":" << number(done - start)
            << ",\"items_rss_mib\":" << number(itemsRss)
            << ",\"commit_peak_rss_mib\":" << number(statusMiB("VmHWM:")) << "}" << std::endl;
  if (!outDir.empty()) {
    std::ofstream(outDir + "/" + chunkindex::kChunkIndexFileName, std::ios::binary)
        .write(index->data(), static_cast<std::streamsize>(index->size()));
    std::ofstream(outDir + "/.metadata", std::ios::binary)
        .write(metadata->data(), static_cast<std::streamsize>(metadata->size()));
  }
  return 0;
}

int buildIndex(int argc, char **argv) {
  if (argc < 1)
    return usage();
  std::string metadataPath = argv[0];
  std::string out;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0 && i + 1 < argc)
      out = argv[++i];
    else
      return usage();
  }
  if (out.empty()) {
    size_t slash = metadataPath.rfind('/');
    out = (slash == std::string::npos ? std::string(".") : metadataPath.substr(0, slash)) + "/" +
          chunkindex::kChunkIndexFileName;
  }
  double start = now();
  std::ifstream in(metadataPath, std::ios::binary);
  if (!in)
    return fail(metadataPath + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string bytes = buffer.str();
  double read = now();
  Result<dcp::Metadata> metadata = dcp::parseMetadata(bytes);
  if (!metadata)
    return fail(metadataPath + ": " + metadata.error());
  double parsed = now();
  uint64_t chunks = metadata->storageData.size();
  Result<std::string> index = chunkindex::build(*metadata, nullptr, bytes.size(),
                                                integrity::xxh3(bytes.data(), bytes.size()));
  if (!index)
    return fail(index.error());
  double built = now();
  std::ofstream(out, std::ios::binary).write(index->data(), index->size());
  std::cout << "{\"bench\":\"chunk_index_build\",\"metadata_bytes\":" << bytes.size()
            << ",\"keys\":" << metadata->stateDictMetadata.size() << ",\"chunks\":" << chunks
            << ",\"index_bytes\":" << index->size() << ",\"read_seconds\":" << number(read - start)
            << ",\"parse_seconds\":" << number(parsed - read)
            << ",\"build_seconds\":" << number(built - parsed)
            << ",\"peak_rss_mib\":" << number(peakRssMiB()) << ",\"out\":\"" << out << "\"}"
            << std::endl;
  return 0;
}

int planLoad(int argc, char **argv) {
  std::string dir, planPath, source = "auto";
  int64_t rank = -1;
  for (int i = 0; i < argc; ++i) {
    std::string option = argv[i];
    if (i + 1 >= argc)
      return usage();
    if (option == "--dir")
      dir = argv[++i];
    else if (option == "--plan")
      planPath = argv[++i];
    else if (option == "--rank")
      rank = std::stoll(argv[++i]);
    else if (option == "--source")
      source = argv[++i];
    else
      return usage();
  }
  if (dir.empty() || planPath.empty() || rank < 0 || (source != "auto" && source != "metadata"))
    return usage();

  double start = now();
  struct stat info {};
  if (::stat(planPath.c_str(), &info) == 0 && S_ISDIR(info.st_mode))
    planPath += "/" + plan::planFileName(rank);
  Result<plan::PlanFile> planFile = plan::PlanFile::open(planPath);
  if (!planFile)
    return fail(planFile.error());
  Result<plan::RankPlan> rankPlan = planFile->rank(rank);
  if (!rankPlan)
    return fail(rankPlan.error());
  double planned = now();

  std::unique_ptr<runtime::Storage> storage = runtime::createPosixStorage();
  runtime::ReaderOptions options;
  options.useChunkIndex = source == "auto";
  Result<std::unique_ptr<runtime::CheckpointReader>> reader =
      runtime::CheckpointReader::open(dir, *storage, options);
  if (!reader)
    return fail(reader.error());
  double opened = now();
  Result<std::vector<std::vector<runtime::SavedChunk>>> reads =
      (*reader)->planReads(rankPlan->reads);
  if (!reads)
    return fail(reads.error());
  double done = now();
  uint64_t overlaps = 0, bytes = 0, uncovered = 0;
  for (size_t i = 0; i < reads->size(); ++i) {
    overlaps += (*reads)[i].size();
    for (const runtime::SavedChunk &chunk : (*reads)[i])
      bytes += chunk.itemLength;
    uncovered += (*reads)[i].empty() && rankPlan->reads[i].source != plan::ItemSource::Bytes;
  }
  std::cout << "{\"bench\":\"reshard_plan\",\"source\":\""
            << ((*reader)->usesChunkIndex() ? "chunk_index" : "metadata") << "\",\"rank\":" << rank
            << ",\"reads\":" << rankPlan->reads.size() << ",\"overlaps\":" << overlaps
            << ",\"reads_without_chunks\":" << uncovered << ",\"item_bytes\":" << bytes
            << ",\"plan_file_seconds\":" << number(planned - start)
            << ",\"open_seconds\":" << number(opened - planned)
            << ",\"plan_seconds\":" << number(done - opened)
            << ",\"seconds\":" << number(done - planned)
            << ",\"bytes_read\":" << (*reader)->bytesRead()
            << ",\"peak_rss_mib\":" << number(peakRssMiB()) << "}" << std::endl;
  return 0;
}


int run(int argc, char **argv) {
  if (argc < 2)
    return usage();
  std::string command = argv[1];
  if (command == "build-index")
    return buildIndex(argc - 2, argv + 2);
  if (command == "plan")
    return planLoad(argc - 2, argv + 2);
  if (command == "fill-checksums")
    return fillChecksums(argc - 2, argv + 2);
  return usage();
}

} // namespace

int main(int argc, char **argv) {
  // Parsing a `.metadata` of ~1 GB may not fit the memory it is given: one
  // line that says so (the bench reports it), not an abort.
  try {
    return run(argc, argv);
  } catch (const std::bad_alloc &) {
    return fail("out of memory (the whole .metadata is parsed on this path)");
  }
}
