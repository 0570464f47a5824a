//===- CheckpointPlan.cpp - Static per-rank checkpoint plans --------------===//
//
// A rank's data file is laid out as: its optimizer `step` items, then its
// hyper-parameter bytes items, then its tensor chunks, each item starting on
// a 4 KiB boundary. Steps and bytes items are assigned round-robin over the
// world (step i to rank i mod W, hyper-parameter j to rank (P + j) mod W), so
// any rank can locate any step without planning the writer's whole file.
// Replicated chunks (HSDP) are written once, by the replica with the fewest
// bytes so far within that (group, shard), starting at a rotating replica.
//
//===----------------------------------------------------------------------===//
#include "fsdp/Plan/CheckpointPlan.h"
#include "fsdp/Format/ChunkIndex.h"
#include "fsdp/Format/Pickle.h"
#include "fsdp/Format/Zip.h"

#include <xxhash.h>

#include <algorithm>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <unordered_map>

namespace fsdp {
namespace plan {

std::optional<uint64_t> pieceDataPageOffset(const BufferRef &buffer, dcp::DType dtype) {
  uint64_t inPage = static_cast<uint64_t>(buffer.localOffset) * dcp::dtypeInfo(dtype).elementSize %
                    zip::kDataPage;
  return inPage % zip::kDataAlignment ? std::nullopt : std::optional<uint64_t>(inPage);
}

namespace {

uint64_t alignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

/// The hyper-parameters PyTorch 2.11-2.15's state dict holds for each kind,
/// in its order (docs/CheckpointFormat.md).
const std::vector<const char *> &hyperParameterNames(OptimizerKind kind) {
  static const std::vector<const char *> adam = {
      "lr",       "betas",      "eps",   "weight_decay", "amsgrad", "maximize",
      "foreach",  "capturable", "differentiable", "fused", "decoupled_weight_decay", "params"};
  static const std::vector<const char *> sgd = {
      "lr",       "momentum", "dampening",      "weight_decay", "nesterov",
      "maximize", "foreach",  "differentiable", "fused",        "params"};
  return kind == OptimizerKind::SGD ? sgd : adam;
}

Result<std::string> hyperParameterPickle(const ModelLayout &model,
                                         const std::vector<std::string> &params,
                                         const std::string &name) {
  const OptimizerSpec &opt = model.optimizer;
  pickle::Writer writer(pickle::Writer::Options{/*memoizeAll=*/true});
  if (name == "lr")
    writer.real(opt.lr);
  else if (name == "betas") {
    writer.real(opt.beta1);
    writer.real(opt.beta2);
    writer.tupleOf(2);
  } else if (name == "eps")
    writer.real(opt.eps);
  else if (name == "weight_decay")
    writer.real(opt.weightDecay);
  else if (name == "momentum")
    writer.real(opt.momentum);
  else if (name == "dampening")
    writer.real(opt.dampening);
  else if (name == "foreach" || name == "fused")
    writer.none();
  else if (name == "decoupled_weight_decay")
    writer.boolean(opt.kind == OptimizerKind::AdamW);
  else if (name == "amsgrad")
    writer.boolean(opt.amsgrad);
  else if (name == "nesterov")
    writer.boolean(opt.nesterov);
  else if (name == "params") {
    writer.emptyList();
    if (!params.empty()) {
      writer.mark();
      for (const std::string &fqn : params)
        writer.string(fqn);
      writer.appends();
    }
  } else
    writer.boolean(false); // maximize, capturable, differentiable
  return writer.finish();
}

/// Which ranks hold each shard, and which shard each rank holds, for one
/// placement list (shared by every group with those placements).
struct ShardMap {
  std::vector<int64_t> shardOfRank;
  std::vector<std::vector<int64_t>> ranksOfShard;
};

/// One chunk of one tensor item before file placement.
struct PendingItem {
  std::string key;
  ItemSource source;
  dcp::DType dtype;
  dcp::Dims globalShape, chunkOffsets, chunkSizes;
  BufferRef buffer;
  std::string payload;
  /// Index in the checkpoint's parameter list (Planner::params_) of the
  /// parameter whose optimizer state this is (-1 otherwise).
  int64_t param = -1;
  /// False for the model keys of a tied parameter's other FQNs: written
  /// (every FQN is a key) but not read back (they share one storage).
  bool loadTarget = true;
};

/// Which replica writes each item of one (group, shard), in shardItems order.
using WriterList = std::vector<int64_t>;

class Planner {
public:
  explicit Planner(const ModelLayout &model) : model_(model) {}

  Status init() {
    if (Status status = checkModelLayout(model_); !status)
      return status;
    world_ = model_.worldSize();
    for (size_t g = 0; g < model_.groups.size(); ++g) {
      const GroupSpec &group = model_.groups[g];
      // Groups on the same mesh with the same placements share their map.
      std::vector<int64_t> expertView;
      if (group.experts) {
        expertView = group.experts->mesh.viewSizes;
        expertView.push_back(group.experts->mesh.expertAxis);
      }
      auto &map = shardMaps_[{group.placements, expertView}];
      if (!map) {
        map = std::make_shared<ShardMap>();
        map->shardOfRank = groupShardOfRank(model_, group);
        map->ranksOfShard.resize(groupShardCount(model_, group));
        for (int64_t rank = 0; rank < world_; ++rank)
          map->ranksOfShard[map->shardOfRank[rank]].push_back(rank);
      }
      groupShards_.push_back(map);
      meshShards_.push_back(groupShardCount(model_, group) / group.expertGroups());
      // Members by offset, for finding the members of a shard by bisection.
      std::vector<size_t> order(group.members.size());
      for (size_t i = 0; i < order.size(); ++i)
        order[i] = i;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        return group.members[a].offset < group.members[b].offset;
      });
      membersByOffset_.push_back(std::move(order));
    }
    listCheckpointParams();
    if (model_.optimizer.present) {
      Result<const zip::ItemLayout *> step = tensorLayout(dcp::DType::Float32, {});
      if (!step)
        return step.failure();
      stepItemSpan_ = alignUp((*step)->totalSize, kItemAlignment);
    }
    return Status::success();
  }

  Result<RankPlan> planRank(int64_t rank);
  Result<dcp::Metadata> globalMetadata();
  Result<uint64_t> streamGlobalMetadata(const dcp::ByteSink &sink, std::string *chunkIndex);

private:
  /// One state_dict_metadata key.
  struct MetadataKey {
    std::string key;
    bool isBytes = false;
    dcp::DType dtype = dcp::DType::Float32;
    dcp::Dims shape;
  };
  /// Every key of the `.metadata`, in PyTorch's order: model keys, optimizer
  /// moments, steps, hyper-parameters.
  std::vector<MetadataKey> metadataKeys() const;
  Result<const zip::ItemLayout *> tensorLayout(dcp::DType dtype, const dcp::Dims &sizes,
                                               std::optional<uint64_t> dataPageOffset = {});
  /// Tensor items of `group` in shard `shard`, in member order.
  void shardItems(size_t group, int64_t shard, std::vector<PendingItem> &out) const;
  /// The replica that writes each item of (group, shard).
  const WriterList &writers(size_t group, int64_t shard);
  /// Whether several ranks hold each shard of `group` (HSDP).
  bool isReplicated(size_t group) const {
    return groupShards_[group]->ranksOfShard.front().size() > 1;
  }
  /// Everything `rank` writes, placed in its file. Memoized.
  Result<const std::vector<WriteItem> *> writesOf(int64_t rank);
  /// writesOf(rank) by (key, chunk offsets), for the reads of other ranks.
  using WriteIndex = std::map<std::pair<std::string, dcp::Dims>, const WriteItem *>;
  Result<const WriteIndex *> writeIndexOf(int64_t rank) {
    auto found = writeIndexes_.find(rank);
    if (found != writeIndexes_.end())
      return &found->second;
    Result<const std::vector<WriteItem> *> writes = writesOf(rank);
    if (!writes)
      return writes.failure();
    WriteIndex &index = writeIndexes_[rank];
    for (const WriteItem &write : **writes)
      index[{write.key, write.chunkOffsets}] = &write;
    return &index;
  }
  Status place(std::vector<PendingItem> &&items, std::vector<WriteItem> &out, uint64_t &cursor);
  bool hasOptimizerState(const GroupSpec &group) const {
    return group.requiresGrad && model_.optimizer.present;
  }
  std::string stepKey(const std::string &fqn) const {
    return optimizerStateKey(fqn, kStepStateName);
  }
  /// The expert-parallel coordinate whose experts shard `shard` of group
  /// `g` holds (0 without experts).
  int64_t expertCoordOfShard(size_t g, int64_t shard) const { return shard / meshShards_[g]; }
  /// Fills params_ and paramIndex_ from the optimizer's parameters.
  void listCheckpointParams();

  const ModelLayout &model_;
  int64_t world_ = 1;
  std::map<std::pair<std::vector<layout::Placement>, std::vector<int64_t>>,
           std::shared_ptr<ShardMap>>
      shardMaps_;
  std::vector<std::shared_ptr<ShardMap>> groupShards_;
  /// Shards of each group's mesh (an experts group has that many per
  /// expert-parallel coordinate).
  std::vector<int64_t> meshShards_;
  std::vector<std::vector<size_t>> membersByOffset_;
  /// The checkpoint's parameters: the optimizer's, an expert parameter once
  /// per global expert. Their steps and the pickled `params` follow it.
  std::vector<std::string> params_;
  /// A leading FQN's indices in params_, by expert-parallel coordinate.
  std::unordered_map<std::string, std::vector<int64_t>> paramIndex_;
  std::map<std::tuple<dcp::DType, dcp::Dims, std::optional<uint64_t>>,
           std::unique_ptr<zip::ItemLayout>>
      layouts_;
  std::unordered_map<int64_t, std::vector<WriteItem>> writes_;
  std::unordered_map<int64_t, WriteIndex> writeIndexes_;
  struct BalanceState {
    std::vector<uint64_t> load;
    size_t nextGroup = 0;
    std::map<size_t, WriterList> writers;
  };
  std::map<std::pair<const ShardMap *, int64_t>, BalanceState> balance_;
  uint64_t stepItemSpan_ = 0;
};

Result<const zip::ItemLayout *> Planner::tensorLayout(dcp::DType dtype, const dcp::Dims &sizes,
                                                      std::optional<uint64_t> dataPageOffset) {
  auto &slot = layouts_[{dtype, sizes, dataPageOffset}];
  if (!slot) {
    Result<zip::ItemLayout> item = zip::planContiguousTensorItem(dtype, sizes, dataPageOffset);
    if (!item)
      return item.failure();
    slot = std::make_unique<zip::ItemLayout>(item.take());
  }
  return slot.get();
}

void Planner::shardItems(size_t g, int64_t shard, std::vector<PendingItem> &out) const {
  const GroupSpec &group = model_.groups[g];
  layout::Range range = shardRange(group, shard);
  const std::vector<size_t> &order = membersByOffset_[g];
  int64_t expertCoord = expertCoordOfShard(g, shard);
  // First member ending after the shard begins.
  auto first = std::partition_point(order.begin(), order.end(), [&](size_t m) {
    const MemberSpec &member = group.members[m];
    return member.offset + layout::numElements(member.shape) <= range.begin;
  });
  std::vector<size_t> inShard;
  for (auto it = first; it != order.end() && group.members[*it].offset < range.end; ++it)
    inShard.push_back(*it);
  std::sort(inShard.begin(), inShard.end()); // member order: stable keys
  for (size_t m : inShard) {
    const MemberSpec &member = group.members[m];
    layout::Piece piece = layout::pieceOf(member.offset, member.shape, range);
    if (piece.empty())
      continue;
    dcp::Dims offsets(member.shape.size(), 0), sizes = member.shape;
    offsets[0] = piece.rowOffset;
    sizes[0] = piece.rows;
    BufferRef ref{static_cast<int32_t>(g), BufferRole::MainWeight, piece.localOffset,
                  piece.rows * layout::rowSize(member.shape)};
    int64_t param = -1;
    if (auto found = paramIndex_.find(member.fqns.front()); found != paramIndex_.end())
      param = found->second[expertCoord];
    auto add = [&](std::string key, BufferRole role, int64_t stateOf, bool loadTarget) {
      const BufferSpec *buffer = group.findBuffer(role);
      BufferRef source = ref;
      source.role = role;
      out.push_back({std::move(key),
                     ItemSource::Buffer,
                     buffer->dtype,
                     member.shape,
                     offsets,
                     sizes,
                     source,
                     {},
                     stateOf,
                     loadTarget});
    };
    for (size_t f = 0; f < member.fqns.size(); ++f)
      add("model." + group.memberFQN(member, f, expertCoord), BufferRole::MainWeight, -1, f == 0);
    if (hasOptimizerState(group)) {
      std::string fqn = group.memberFQN(member, 0, expertCoord);
      for (BufferRole role : model_.optimizer.stateRoles)
        add(optimizerStateKey(fqn, bufferRoleName(role)), role, param, true);
    }
  }
}

const WriterList &Planner::writers(size_t g, int64_t shard) {
  const ShardMap *map = groupShards_[g].get();
  BalanceState &state = balance_[{map, shard}];
  const std::vector<int64_t> &replicas = map->ranksOfShard[shard];
  if (state.load.empty())
    state.load.assign(replicas.size(), 0);
  // Groups are balanced in order, the load carried from group to group, so
  // the replicas of a shard share all of its bytes evenly.
  for (; state.nextGroup <= g; ++state.nextGroup) {
    size_t group = state.nextGroup;
    if (groupShards_[group].get() != map)
      continue;
    std::vector<PendingItem> items;
    shardItems(group, shard, items);
    WriterList &writers = state.writers[group];
    writers.resize(items.size());
    if (replicas.size() == 1) {
      std::fill(writers.begin(), writers.end(), replicas[0]);
      continue;
    }
    // Min-heap of (bytes so far, replica index): O(items log replicas).
    using Entry = std::pair<uint64_t, size_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
    for (size_t k = 0; k < replicas.size(); ++k)
      heap.push({state.load[k], k});
    for (size_t i = 0; i < items.size(); ++i) {
      auto [load, k] = heap.top();
      heap.pop();
      uint64_t bytes = static_cast<uint64_t>(items[i].buffer.elements) *
                       dcp::dtypeInfo(items[i].dtype).elementSize;
      state.load[k] = load + bytes;
      heap.push({state.load[k], k});
      writers[i] = replicas[k];
    }
  }
  return state.writers[g];
}

Status Planner::place(std::vector<PendingItem> &&items, std::vector<WriteItem> &out,
                      uint64_t &cursor) {
  for (PendingItem &item : items) {
    WriteItem write;
    write.key = std::move(item.key);
    write.source = item.source;
    write.dtype = item.dtype;
    write.globalShape = std::move(item.globalShape);
    write.chunkOffsets = std::move(item.chunkOffsets);
    write.chunkSizes = std::move(item.chunkSizes);
    write.buffer = item.buffer;
    write.itemOffset = cursor;
    if (item.source == ItemSource::Bytes) {
      write.itemLength = item.payload.size();
      write.payload = std::move(item.payload);
    } else {
      Result<const zip::ItemLayout *> layout = tensorLayout(
          write.dtype, write.chunkSizes,
          item.source == ItemSource::Buffer ? pieceDataPageOffset(write.buffer, write.dtype)
                                            : std::nullopt);
      if (!layout)
        return propagate(layout, write.key + ": " + layout.error());
      write.itemLength = (*layout)->totalSize;
      write.dataOffset = cursor + (*layout)->dataOffset;
      write.dataLength = (*layout)->dataSize;
    }
    cursor = alignUp(cursor + write.itemLength, kItemAlignment);
    out.push_back(std::move(write));
  }
  return Status::success();
}

Result<const std::vector<WriteItem> *> Planner::writesOf(int64_t rank) {
  auto found = writes_.find(rank);
  if (found != writes_.end())
    return &found->second;
  std::vector<WriteItem> writes;
  uint64_t cursor = 0;
  std::vector<PendingItem> pending;
  // Steps i = rank, rank + W, ... then hyper-parameters (P + j) = rank mod W
  // (P = 0 for an optimizer without steps).
  int64_t numParams = model_.optimizer.hasStep ? static_cast<int64_t>(params_.size()) : 0;
  if (model_.optimizer.present) {
    const std::vector<const char *> &names = hyperParameterNames(model_.optimizer.kind);
    for (int64_t i = rank; i < numParams; i += world_)
      pending.push_back({stepKey(params_[i]),
                         ItemSource::Step,
                         dcp::DType::Float32,
                         {},
                         {},
                         {},
                         {},
                         {},
                         i});
    for (size_t j = 0; j < names.size(); ++j) {
      if ((numParams + static_cast<int64_t>(j)) % world_ != rank)
        continue;
      Result<std::string> pickled = hyperParameterPickle(model_, params_, names[j]);
      if (!pickled)
        return pickled.failure();
      Result<std::string> archive = zip::buildObjectItem(*pickled);
      if (!archive)
        return archive.failure();
      PendingItem item{std::string("optimizer.param_groups.0.") + names[j],
                       ItemSource::Bytes,
                       dcp::DType::UInt8,
                       {},
                       {},
                       {},
                       {},
                       archive.take(),
                       -1};
      pending.push_back(std::move(item));
    }
  }
  if (Status status = place(std::move(pending), writes, cursor); !status)
    return status.failure();
  for (size_t g = 0; g < model_.groups.size(); ++g) {
    int64_t shard = groupShards_[g]->shardOfRank[rank];
    std::vector<PendingItem> items;
    shardItems(g, shard, items);
    // A shard held by one rank is all its own: no balancing to look up.
    if (isReplicated(g)) {
      const WriterList &writerOf = writers(g, shard);
      std::vector<PendingItem> mine;
      for (size_t index = 0; index < items.size(); ++index)
        if (writerOf[index] == rank)
          mine.push_back(std::move(items[index]));
      items = std::move(mine);
    }
    if (Status status = place(std::move(items), writes, cursor); !status)
      return status.failure();
  }
  return &writes_.emplace(rank, std::move(writes)).first->second;
}

Result<RankPlan> Planner::planRank(int64_t rank) {
  // The memo serves one rank's reads of its replicas' files; planning the
  // world rank by rank must not keep every rank's items.
  if (writes_.size() > 256) {
    writeIndexes_.clear(); // points into writes_
    writes_.clear();
  }
  if (balance_.size() > 4096)
    balance_.clear();
  if (rank < 0 || rank >= world_)
    return makeError("rank " + std::to_string(rank) + " is outside the mesh of " +
                     std::to_string(world_) + " ranks");
  RankPlan plan;
  plan.rank = rank;
  plan.coords = layout::rankCoords(rank, model_.meshSizes);
  for (size_t g = 0; g < model_.groups.size(); ++g) {
    const GroupSpec &group = model_.groups[g];
    int64_t begin = shardRange(group, groupShards_[g]->shardOfRank[rank]).begin;
    for (const BufferSpec &buffer : group.buffers)
      plan.buffers.push_back({static_cast<int32_t>(g), buffer.role, buffer.dtype, group.shardSize,
                              begin, buffer.aliasesMainWeight});
  }
  Result<const std::vector<WriteItem> *> writes = writesOf(rank);
  if (!writes)
    return writes.failure();
  plan.writes = **writes;
  if (!plan.writes.empty()) {
    const WriteItem &last = plan.writes.back();
    plan.files.push_back({dataFileName(rank), last.itemOffset + last.itemLength});
  }

  // Reads for a load into this same layout: every piece this rank holds,
  // from whichever replica wrote it, and the step of every trainable
  // parameter it holds a piece of.
  std::vector<bool> needsStep(params_.size(), false);
  for (size_t g = 0; g < model_.groups.size(); ++g) {
    int64_t shard = groupShards_[g]->shardOfRank[rank];
    std::vector<PendingItem> items;
    shardItems(g, shard, items);
    const WriterList writerOf =
        isReplicated(g) ? writers(g, shard) : WriterList(items.size(), rank);
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].loadTarget)
        continue;
      Result<const WriteIndex *> source = writeIndexOf(writerOf[i]);
      if (!source)
        return source.failure();
      const PendingItem &item = items[i];
      auto found = (*source)->find({item.key, item.chunkOffsets});
      if (found == (*source)->end())
        return makeError(item.key + ": no replica writes the chunk at row " +
                         std::to_string(item.chunkOffsets[0]));
      const WriteItem *written = found->second;
      plan.reads.push_back({item.key, ItemSource::Buffer, item.dtype, item.globalShape,
                            item.chunkOffsets, item.chunkSizes, item.buffer,
                            dataFileName(writerOf[i]), written->itemOffset, written->itemLength,
                            written->dataOffset, written->dataLength});
      if (item.param >= 0)
        needsStep[item.param] = true;
    }
  }
  if (model_.optimizer.present && model_.optimizer.hasStep) {
    Result<const zip::ItemLayout *> step = tensorLayout(dcp::DType::Float32, {});
    if (!step)
      return step.failure();
    for (size_t i = 0; i < needsStep.size(); ++i) {
      if (!needsStep[i])
        continue;
      int64_t writer = static_cast<int64_t>(i) % world_;
      uint64_t itemOffset = (static_cast<int64_t>(i) / world_) * stepItemSpan_;
      plan.reads.push_back({stepKey(params_[i]),
                            ItemSource::Step,
                            dcp::DType::Float32,
                            {},
                            {},
                            {},
                            {},
                            dataFileName(writer),
                            itemOffset,
                            (*step)->totalSize,
                            itemOffset + (*step)->dataOffset,
                            (*step)->dataSize});
    }
  }
  return plan;
}

void Planner::listCheckpointParams() {
  // An experts group's parameters are listed where its first one is, in the
  // order a model holding every expert (EP 1) lists them, whatever the EP
  // size: grouped, each parameter path's experts 0..E-1 in turn; local
  // experts, each expert's parameters in turn.
  struct Owner {
    size_t group;
    const MemberSpec *member;
  };
  std::unordered_map<std::string, Owner> ownerOf;
  for (size_t g = 0; g < model_.groups.size(); ++g)
    for (const MemberSpec &member : model_.groups[g].members)
      ownerOf.emplace(member.fqns.front(), Owner{g, &member});
  std::vector<std::vector<const MemberSpec *>> expertParams(model_.groups.size());
  for (const std::string &fqn : model_.optimizerParams) {
    const Owner &owner = ownerOf.at(fqn); // checkModelLayout: a trainable member's FQN
    if (model_.groups[owner.group].experts)
      expertParams[owner.group].push_back(owner.member);
  }
  std::unordered_map<std::string, int64_t> indexOf;
  auto add = [&](std::string name) {
    indexOf.emplace(name, static_cast<int64_t>(params_.size()));
    params_.push_back(std::move(name));
  };
  for (const std::string &fqn : model_.optimizerParams) {
    const Owner &owner = ownerOf.at(fqn);
    const GroupSpec &group = model_.groups[owner.group];
    if (!group.experts) {
      paramIndex_[fqn] = {static_cast<int64_t>(params_.size())};
      add(fqn);
      continue;
    }
    std::vector<const MemberSpec *> &members = expertParams[owner.group];
    if (members.empty())
      continue; // listed where the group's first parameter stands
    int64_t count = group.experts->perRank * group.expertGroups();
    // The distinct (head, tail) slots, in first-occurrence order.
    std::vector<std::pair<std::string, std::string>> slots;
    std::set<std::pair<std::string, std::string>> seen;
    for (const MemberSpec *member : members)
      if (seen.insert({member->expert->head, member->expert->tail}).second)
        slots.push_back({member->expert->head, member->expert->tail});
    auto name = [](const std::pair<std::string, std::string> &slot, int64_t number) {
      return slot.first + std::to_string(number) + slot.second;
    };
    if (group.experts->naming == layout::ExpertNaming::Grouped) {
      for (const auto &slot : slots)
        for (int64_t number = 0; number < count; ++number)
          add(name(slot, number));
    } else {
      for (int64_t number = 0; number < count; ++number)
        for (const auto &slot : slots)
          add(name(slot, number));
    }
    for (const MemberSpec *member : members)
      for (int64_t e = 0; e < group.expertGroups(); ++e)
        paramIndex_[member->fqns.front()].push_back(indexOf.at(group.memberFQN(*member, 0, e)));
    members.clear();
  }
}

std::vector<Planner::MetadataKey> Planner::metadataKeys() const {
  std::vector<MetadataKey> keys;
  // An experts group's keys come once per global expert, in global order.
  for (const GroupSpec &group : model_.groups)
    for (int64_t e = 0; e < group.expertGroups(); ++e)
      for (const MemberSpec &member : group.members)
        for (size_t f = 0; f < member.fqns.size(); ++f)
          keys.push_back({"model." + group.memberFQN(member, f, e), false,
                          group.findBuffer(BufferRole::MainWeight)->dtype, member.shape});
  for (const GroupSpec &group : model_.groups)
    if (hasOptimizerState(group))
      for (int64_t e = 0; e < group.expertGroups(); ++e)
        for (const MemberSpec &member : group.members)
          for (BufferRole role : model_.optimizer.stateRoles)
            keys.push_back({optimizerStateKey(group.memberFQN(member, 0, e), bufferRoleName(role)),
                            false, group.findBuffer(role)->dtype, member.shape});
  if (model_.optimizer.present) {
    if (model_.optimizer.hasStep)
      for (const std::string &fqn : params_)
        keys.push_back({stepKey(fqn), false, dcp::DType::Float32, {}});
    for (const char *name : hyperParameterNames(model_.optimizer.kind))
      keys.push_back({std::string("optimizer.param_groups.0.") + name, true, {}, {}});
  }
  return keys;
}

/// planner_data's path of a key: (model, fqn), (optimizer, state, fqn, name)
/// or (optimizer, param_groups, 0, name).
std::vector<dcp::PathPart> plannerPath(const std::string &key) {
  if (key.rfind("model.", 0) == 0)
    return {std::string("model"), key.substr(6)};
  if (key.rfind("optimizer.param_groups.0.", 0) == 0)
    return {std::string("optimizer"), std::string("param_groups"), int64_t(0), key.substr(25)};
  // optimizer.state.<fqn>.<state>
  std::string rest = key.substr(16);
  size_t dot = rest.rfind('.');
  return {std::string("optimizer"), std::string("state"), rest.substr(0, dot),
          rest.substr(dot + 1)};
}

/// Whether a chunk is offsets (row, 0, ...), sizes (rows, shape[1], ...).
bool isRowBand(const WriteItem &write, const dcp::Dims &shape) {
  if (write.chunkOffsets.size() != shape.size() || write.chunkSizes.size() != shape.size())
    return false;
  for (size_t d = 1; d < shape.size(); ++d)
    if (write.chunkOffsets[d] != 0 || write.chunkSizes[d] != shape[d])
      return false;
  return true;
}

Result<dcp::Metadata> Planner::globalMetadata() {
  dcp::Metadata metadata;
  metadata.version = "1.0.0";
  std::unordered_map<std::string, size_t> entryOf;
  for (MetadataKey &key : metadataKeys()) {
    dcp::StorageMetadata storage;
    storage.isBytes = key.isBytes;
    storage.properties.dtype = key.dtype;
    storage.size = std::move(key.shape);
    entryOf.emplace(key.key, metadata.stateDictMetadata.size());
    metadata.stateDictMetadata.emplace_back(std::move(key.key), std::move(storage));
  }
  metadata.plannerData.emplace();
  for (const auto &entry : metadata.stateDictMetadata)
    metadata.plannerData->emplace_back(entry.first, plannerPath(entry.first));

  for (int64_t rank = 0; rank < world_; ++rank) {
    Result<const std::vector<WriteItem> *> writes = writesOf(rank);
    if (!writes)
      return writes.failure();
    for (const WriteItem &write : **writes) {
      auto entry = entryOf.find(write.key);
      if (entry == entryOf.end())
        return makeError(write.key + ": planned but not a key of the model");
      dcp::StorageMetadata &storage = metadata.stateDictMetadata[entry->second].second;
      dcp::MetadataIndex index{write.key, std::nullopt, std::nullopt};
      if (!storage.isBytes) {
        index.offset = write.chunkOffsets;
        index.index = static_cast<int64_t>(storage.chunks.size());
        storage.chunks.push_back({write.chunkOffsets, write.chunkSizes});
      }
      metadata.storageData.emplace_back(
          std::move(index),
          dcp::StorageInfo{dataFileName(rank), write.itemOffset, write.itemLength, std::nullopt});
    }
    writeIndexes_.erase(rank);
    writes_.erase(rank); // O(one rank) memory while walking the world.
  }
  return metadata;
}

Result<uint64_t> Planner::streamGlobalMetadata(const dcp::ByteSink &sink, std::string *chunkIndex) {
  // state_dict_metadata lists each key's chunks in rank order and comes
  // before storage_data, which lists every rank's items: one walk of the
  // world keeps, per chunk, only what the pickle needs (its rows, and where
  // the item lies), about 40 bytes instead of a dcp::Metadata's ~400.
  std::vector<MetadataKey> keys = metadataKeys();
  std::unordered_map<std::string_view, uint32_t> keyIndex; // views into `keys`
  for (size_t k = 0; k < keys.size(); ++k)
    keyIndex.emplace(keys[k].key, static_cast<uint32_t>(k));
  // Chunks are row bands: offsets (row, 0, ...), sizes (rows, shape[1], ...).
  struct RowBand {
    int64_t row, rows;
  };
  std::vector<std::vector<RowBand>> bands(keys.size());
  struct StoredItem {
    uint32_t key;
    uint64_t itemOffset, itemLength;
  };
  std::vector<StoredItem> items;
  std::vector<size_t> rankEnd(static_cast<size_t>(world_));
  for (int64_t rank = 0; rank < world_; ++rank) {
    Result<const std::vector<WriteItem> *> writes = writesOf(rank);
    if (!writes)
      return writes.failure();
    for (const WriteItem &write : **writes) {
      auto found = keyIndex.find(write.key);
      if (found == keyIndex.end())
        return makeError(write.key + ": planned but not a key of the model");
      const MetadataKey &key = keys[found->second];
      if (!key.isBytes) {
        if (!isRowBand(write, key.shape))
          return makeError(write.key + ": planned chunk is not a band of whole rows");
        bands[found->second].push_back(key.shape.empty()
                                           ? RowBand{0, 0}
                                           : RowBand{write.chunkOffsets[0], write.chunkSizes[0]});
      }
      items.push_back({found->second, write.itemOffset, write.itemLength});
    }
    rankEnd[static_cast<size_t>(rank)] = items.size();
    writeIndexes_.erase(rank);
    writes_.erase(rank); // O(one rank) memory while walking the world.
  }

  // The chunk index's header holds the pickle's length and xxh3.
  integrity::StreamingXxh3 pickleHash;
  dcp::MetadataStreamWriter writer([&](std::string_view bytes) -> Status {
    if (chunkIndex)
      pickleHash.update(bytes.data(), bytes.size());
    return sink(bytes);
  });
  dcp::Dims offsets, sizes;
  auto chunkBox = [&](const MetadataKey &key, const RowBand &band) {
    offsets.assign(key.shape.size(), 0);
    sizes = key.shape;
    if (!key.shape.empty()) {
      offsets[0] = band.row;
      sizes[0] = band.rows;
    }
  };
  for (size_t k = 0; k < keys.size(); ++k) {
    const MetadataKey &key = keys[k];
    if (key.isBytes) {
      writer.bytesItem(key.key);
      continue;
    }
    dcp::TensorProperties properties;
    properties.dtype = key.dtype;
    writer.tensor(key.key, properties, key.shape);
    for (const RowBand &band : bands[k]) {
      chunkBox(key, band);
      writer.chunk(offsets, sizes);
    }
    if (!writer.status())
      return writer.status().failure();
  }
  writer.plannerData();
  for (const MetadataKey &key : keys)
    writer.plannerPath(key.key, plannerPath(key.key));
  // Chunk j of a key is its j-th item in rank order, as the walk found them.
  std::vector<uint32_t> nextChunk(keys.size(), 0);
  size_t item = 0;
  for (int64_t rank = 0; rank < world_; ++rank) {
    std::string file = dataFileName(rank);
    for (; item < rankEnd[static_cast<size_t>(rank)]; ++item) {
      const StoredItem &stored = items[item];
      const MetadataKey &key = keys[stored.key];
      if (key.isBytes) {
        writer.storage(key.key, nullptr, std::nullopt, file, stored.itemOffset, stored.itemLength);
        continue;
      }
      uint32_t chunk = nextChunk[stored.key]++;
      chunkBox(key, bands[stored.key][chunk]);
      writer.storage(key.key, &offsets, int64_t(chunk), file, stored.itemOffset, stored.itemLength);
    }
    if (!writer.status())
      return writer.status().failure();
  }
  Result<uint64_t> pickled = writer.finish(std::nullopt, std::string("1.0.0"));
  if (!pickled || !chunkIndex)
    return pickled;

  // The chunk index of the same chunks, without checksums (the commit fills
  // them in): from the ~40 bytes a chunk kept above, not a dcp::Metadata.
  // Data files: every rank that writes, by name.
  std::vector<std::pair<std::string, int64_t>> fileNames;
  for (int64_t rank = 0; rank < world_; ++rank)
    if (rankEnd[static_cast<size_t>(rank)] != (rank ? rankEnd[static_cast<size_t>(rank - 1)] : 0))
      fileNames.push_back({dataFileName(rank), rank});
  std::sort(fileNames.begin(), fileNames.end());
  std::vector<uint32_t> fileOfRank(static_cast<size_t>(world_), 0);
  std::vector<std::string> files;
  for (const auto &[name, rank] : fileNames) {
    fileOfRank[static_cast<size_t>(rank)] = static_cast<uint32_t>(files.size());
    files.push_back(name);
  }
  fileNames.clear();
  // Each key's items (4 bytes an item), bucketed by key in rank order:
  // chunk j of a key is its j-th item, as above.
  std::vector<uint64_t> keyBegin(keys.size() + 1, 0);
  for (const StoredItem &stored : items)
    ++keyBegin[stored.key + 1];
  for (size_t k = 0; k < keys.size(); ++k)
    keyBegin[k + 1] += keyBegin[k];
  std::vector<uint32_t> byKey(items.size());
  {
    std::vector<uint64_t> next(keyBegin.begin(), keyBegin.end() - 1);
    for (size_t i = 0; i < items.size(); ++i)
      byKey[next[items[i].key]++] = static_cast<uint32_t>(i);
  }
  std::vector<uint32_t> keyOrder(keys.size());
  for (size_t k = 0; k < keys.size(); ++k)
    keyOrder[k] = static_cast<uint32_t>(k);
  std::sort(keyOrder.begin(), keyOrder.end(),
            [&](uint32_t a, uint32_t b) { return keys[a].key < keys[b].key; });
  Result<chunkindex::Builder> builder = chunkindex::Builder::create(std::move(files));
  if (!builder)
    return builder.failure();
  builder->reserve(keys.size(), items.size());
  std::vector<std::pair<int64_t, uint32_t>> chunks; // (row, chunk), sorted by row
  for (uint32_t k : keyOrder) {
    const MetadataKey &key = keys[k];
    Status status = builder->addKey(key.key, key.isBytes, key.dtype, key.shape);
    if (!status && status.kind() == ErrorKind::Incompatible) {
      chunkIndex->clear(); // more dimensions than an index holds: loads read `.metadata`
      return pickled;
    }
    if (!status)
      return status.failure();
    uint64_t begin = keyBegin[k], end = keyBegin[k + 1];
    chunks.clear();
    for (uint64_t j = 0; j < end - begin; ++j)
      chunks.push_back({key.isBytes ? 0 : bands[k][j].row, static_cast<uint32_t>(j)});
    std::stable_sort(chunks.begin(), chunks.end());
    for (const auto &[row, j] : chunks) {
      uint32_t i = byKey[begin + j];
      const StoredItem &stored = items[i];
      size_t rank = std::upper_bound(rankEnd.begin(), rankEnd.end(), size_t(i)) - rankEnd.begin();
      if (key.isBytes) {
        offsets.clear();
        sizes.clear();
      } else {
        chunkBox(key, bands[k][j]);
      }
      if (Status added = builder->addChunk(offsets, sizes, fileOfRank[rank], stored.itemOffset,
                                           stored.itemLength);
          !added)
        return added.failure();
    }
  }
  Result<std::string> index = builder->finish(false, *pickled, pickleHash.digest());
  if (!index)
    return index.failure();
  *chunkIndex = index.take();
  return pickled;
}

} // namespace

class CheckpointPlanner::Impl : public Planner {
public:
  using Planner::Planner;
};

CheckpointPlanner::CheckpointPlanner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointPlanner::CheckpointPlanner(CheckpointPlanner &&) noexcept = default;
CheckpointPlanner &CheckpointPlanner::operator=(CheckpointPlanner &&) noexcept = default;
CheckpointPlanner::~CheckpointPlanner() = default;

Result<CheckpointPlanner> CheckpointPlanner::create(const ModelLayout &model) {
  auto impl = std::make_unique<Impl>(model);
  if (Status status = impl->init(); !status)
    return status.failure();
  return CheckpointPlanner(std::move(impl));
}

Result<RankPlan> CheckpointPlanner::planRank(int64_t rank) { return impl_->planRank(rank); }
Result<dcp::Metadata> CheckpointPlanner::globalMetadata() { return impl_->globalMetadata(); }
Result<uint64_t> CheckpointPlanner::streamGlobalMetadata(const dcp::ByteSink &sink,
                                                         std::string *chunkIndex) {
  return impl_->streamGlobalMetadata(sink, chunkIndex);
}

std::string dataFileName(int64_t rank) { return "__" + std::to_string(rank) + "_0.distcp"; }

layout::Range shardRange(const GroupSpec &group, int64_t shard) {
  // An experts group's shards repeat its mesh's layout per expert coordinate.
  int64_t meshShards = group.shardSize > 0 ? group.size / group.shardSize : 1;
  int64_t inMesh = meshShards > 0 ? shard % meshShards : shard;
  return {inMesh * group.shardSize, (inMesh + 1) * group.shardSize};
}

std::vector<int64_t> rankRangeBegins(const ModelLayout &model, const GroupSpec &group) {
  std::vector<int64_t> begins = groupShardOfRank(model, group);
  for (int64_t &begin : begins)
    begin = shardRange(group, begin).begin;
  return begins;
}

std::vector<ShardPiece> memberPieces(const GroupSpec &group, const MemberSpec &member) {
  std::vector<ShardPiece> pieces;
  int64_t numel = layout::numElements(member.shape);
  if (group.shardSize <= 0 || numel <= 0)
    return pieces;
  for (int64_t shard = member.offset / group.shardSize,
               last = (member.offset + numel - 1) / group.shardSize;
       shard <= last; ++shard)
    if (layout::Piece piece = layout::pieceOf(member.offset, member.shape, shardRange(group, shard));
        !piece.empty())
      pieces.push_back({shard, piece});
  return pieces;
}

std::string optimizerStateKey(const std::string &fqn, const char *state) {
  return "optimizer.state." + fqn + "." + state;
}

Result<RankPlan> planRank(const ModelLayout &model, int64_t rank) {
  Result<CheckpointPlanner> planner = CheckpointPlanner::create(model);
  if (!planner)
    return planner.failure();
  return planner->planRank(rank);
}

Result<dcp::Metadata> planGlobalMetadata(const ModelLayout &model) {
  Result<CheckpointPlanner> planner = CheckpointPlanner::create(model);
  if (!planner)
    return planner.failure();
  return planner->globalMetadata();
}

Result<uint64_t> streamGlobalMetadata(const ModelLayout &model, const dcp::ByteSink &sink) {
  Result<CheckpointPlanner> planner = CheckpointPlanner::create(model);
  if (!planner)
    return planner.failure();
  return planner->streamGlobalMetadata(sink);
}

uint64_t planIdentity(const ModelLayout &model) {
  XXH3_state_t *state = XXH3_createState();
  XXH3_64bits_reset(state);
  auto add = [&](const std::string &text) {
    XXH3_64bits_update(state, text.data(), text.size());
    XXH3_64bits_update(state, "\0", 1);
  };
  auto addInt = [&](int64_t value) { add(std::to_string(value)); };
  add("fsdp-plan-v" + std::to_string(kPlanFormatVersion));
  for (size_t i = 0; i < model.meshSizes.size(); ++i) {
    add(model.meshAxisNames[i]);
    addInt(model.meshSizes[i]);
  }
  const OptimizerSpec &opt = model.optimizer;
  addInt(opt.present);
  addInt(static_cast<int>(opt.kind));
  for (double value :
       {opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weightDecay, opt.momentum, opt.dampening})
    XXH3_64bits_update(state, &value, sizeof(value));
  addInt(opt.amsgrad);
  addInt(opt.nesterov);
  addInt(static_cast<int>(opt.stateDtype));
  for (BufferRole role : opt.stateRoles)
    addInt(static_cast<int>(role));
  addInt(opt.hasStep);
  for (const GroupSpec &group : model.groups) {
    add(group.unit);
    addInt(static_cast<int>(group.dtype));
    addInt(group.requiresGrad);
    for (layout::Placement placement : group.placements)
      addInt(static_cast<int>(placement));
    addInt(group.chunk);
    addInt(group.size);
    addInt(group.shardSize);
    for (const BufferSpec &buffer : group.buffers) {
      addInt(static_cast<int>(buffer.role));
      addInt(static_cast<int>(buffer.dtype));
    }
    if (group.experts) {
      add("experts");
      for (int64_t size : group.experts->mesh.viewSizes)
        addInt(size);
      addInt(group.experts->mesh.expertAxis);
      addInt(group.experts->perRank);
      addInt(static_cast<int>(group.experts->naming));
    }
    for (const MemberSpec &member : group.members) {
      for (const std::string &fqn : member.fqns)
        add(fqn);
      for (int64_t dim : member.shape)
        addInt(dim);
      addInt(member.offset);
      if (member.expert) {
        add(member.expert->head);
        addInt(member.expert->local);
        add(member.expert->tail);
      }
    }
  }
  for (const std::string &fqn : model.optimizerParams)
    add(fqn);
  uint64_t hash = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return hash;
}

} // namespace plan
} // namespace fsdp
