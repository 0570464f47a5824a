//===- Communicator.cpp - One process, callbacks, a group of threads ------===//
#include "fsdp/Runtime/Communicator.h"
#include "fsdp/Runtime/CudaBackend.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace fsdp {
namespace runtime {

Status Communicator::broadcastInPlace(void *data, uint64_t size, int64_t root) {
  std::string bytes;
  if (rank() == root)
    bytes.assign(static_cast<const char *>(data), size);
  Result<std::string> out = broadcast(bytes, root);
  if (!out)
    return out.failure();
  if (out->size() != size)
    return makeError("broadcast: " + std::to_string(out->size()) + " bytes arrived where " +
                         std::to_string(size) + " were expected",
                     ErrorKind::Internal);
  if (rank() != root)
    std::memcpy(data, out->data(), size);
  return Status::success();
}

namespace {

Error badRoot(int64_t root, int64_t size) {
  return makeError("root rank " + std::to_string(root) + " is outside a group of " +
                       std::to_string(size),
                   ErrorKind::InvalidArgument);
}

class SingleProcessCommunicator : public Communicator {
public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  Status barrier() override { return Status::success(); }
  Result<std::vector<std::string>> gather(const std::string &bytes, int64_t root) override {
    if (root != 0)
      return badRoot(root, 1);
    return std::vector<std::string>{bytes};
  }
  Result<std::string> broadcast(const std::string &bytes, int64_t root) override {
    if (root != 0)
      return badRoot(root, 1);
    return bytes;
  }
  Result<std::unique_ptr<Communicator>> split(int64_t, int64_t) override {
    return std::unique_ptr<Communicator>(new SingleProcessCommunicator());
  }
};

//===----------------------------------------------------------------------===//
// Callbacks
//===----------------------------------------------------------------------===//

class CallbackCommunicator : public Communicator {
public:
  explicit CallbackCommunicator(CommunicatorCallbacks callbacks)
      : callbacks_(std::move(callbacks)) {}
  int64_t rank() const override { return callbacks_.rank; }
  int64_t size() const override { return callbacks_.size; }
  Status barrier() override { return callbacks_.barrier(); }

  Result<std::vector<std::string>> gather(const std::string &bytes, int64_t root) override {
    if (root < 0 || root >= size())
      return badRoot(root, size());
    // Sizes to the root, the largest back to everyone, then the bytes
    // padded to it.
    uint64_t mine = bytes.size();
    std::vector<uint64_t> sizes(static_cast<size_t>(size()));
    if (Status status = callbacks_.gather(&mine, sizeof(mine), sizes.data(), root); !status)
      return status.failure();
    uint64_t largest = rank() == root ? *std::max_element(sizes.begin(), sizes.end()) : 0;
    if (Status status = callbacks_.broadcast(&largest, sizeof(largest), root); !status)
      return status.failure();
    std::string padded = bytes;
    padded.resize(largest, '\0');
    std::string all(rank() == root ? largest * static_cast<uint64_t>(size()) : 0, '\0');
    if (Status status = callbacks_.gather(padded.data(), largest, all.data(), root); !status)
      return status.failure();
    std::vector<std::string> out;
    if (rank() == root)
      for (int64_t r = 0; r < size(); ++r)
        out.push_back(all.substr(static_cast<size_t>(r) * largest, sizes[r]));
    return out;
  }

  Result<std::string> broadcast(const std::string &bytes, int64_t root) override {
    if (root < 0 || root >= size())
      return badRoot(root, size());
    uint64_t length = bytes.size();
    if (Status status = callbacks_.broadcast(&length, sizeof(length), root); !status)
      return status.failure();
    std::string out = rank() == root ? bytes : std::string(length, '\0');
    if (Status status = callbacks_.broadcast(out.data(), length, root); !status)
      return status.failure();
    return out;
  }

  Status broadcastInPlace(void *data, uint64_t size, int64_t root) override {
    if (root < 0 || root >= this->size())
      return badRoot(root, this->size());
    return callbacks_.broadcast(data, size, root);
  }

  bool canSplit() const override { return static_cast<bool>(callbacks_.split); }

  Result<std::unique_ptr<Communicator>> split(int64_t color, int64_t key) override {
    if (!callbacks_.split)
      return makeError("this communicator's callbacks cannot split into sub-groups",
                       ErrorKind::InvalidArgument);
    Result<CommunicatorCallbacks> child = callbacks_.split(color, key);
    if (!child)
      return child.failure();
    return createCallbackCommunicator(child.take());
  }

private:
  CommunicatorCallbacks callbacks_;
};

//===----------------------------------------------------------------------===//
// A group of threads
//===----------------------------------------------------------------------===//

/// What the ranks of one thread group share: one exchange at a time, in
/// which every rank deposits a string and receives all of them.
struct ThreadGroupState {
  explicit ThreadGroupState(int64_t size) : size(size), slots(static_cast<size_t>(size)) {}

  std::vector<std::string> exchange(int64_t rank, std::string contribution) {
    std::unique_lock<std::mutex> lock(mutex);
    slots[rank] = std::move(contribution);
    uint64_t round = generation;
    if (++arrived == size) {
      // The last to arrive publishes the round. Nobody can start the next
      // one before every rank has taken this one's result.
      result = std::move(slots);
      slots.assign(static_cast<size_t>(size), std::string());
      arrived = 0;
      ++generation;
      changed.notify_all();
    } else {
      changed.wait(lock, [&] { return generation != round; });
    }
    return result;
  }

  /// The state of the sub-group (split number `split`, `color`), made by
  /// whichever member asks first.
  std::shared_ptr<ThreadGroupState> child(uint64_t split, int64_t color, int64_t childSize) {
    std::lock_guard<std::mutex> lock(mutex);
    auto &slot = children[{split, color}];
    if (!slot)
      slot = std::make_shared<ThreadGroupState>(childSize);
    return slot;
  }

  const int64_t size;
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::string> slots, result;
  int64_t arrived = 0;
  uint64_t generation = 0;
  std::map<std::pair<uint64_t, int64_t>, std::shared_ptr<ThreadGroupState>> children;
};

class ThreadCommunicator : public Communicator {
public:
  ThreadCommunicator(std::shared_ptr<ThreadGroupState> state, int64_t rank)
      : state_(std::move(state)), rank_(rank) {}
  int64_t rank() const override { return rank_; }
  int64_t size() const override { return state_->size; }
  Status barrier() override {
    state_->exchange(rank_, std::string());
    return Status::success();
  }
  Result<std::vector<std::string>> gather(const std::string &bytes, int64_t root) override {
    // Every rank takes part even when the root is wrong, so none waits.
    std::vector<std::string> all = state_->exchange(rank_, bytes);
    if (root < 0 || root >= size())
      return badRoot(root, size());
    return rank_ == root ? all : std::vector<std::string>();
  }
  Result<std::string> broadcast(const std::string &bytes, int64_t root) override {
    std::vector<std::string> all = state_->exchange(rank_, rank_ == root ? bytes : std::string());
    if (root < 0 || root >= size())
      return badRoot(root, size());
    return all[root];
  }
  Result<std::unique_ptr<Communicator>> split(int64_t color, int64_t key) override {
    std::string mine(16, '\0');
    std::memcpy(mine.data(), &color, 8);
    std::memcpy(mine.data() + 8, &key, 8);
    std::vector<std::string> all = state_->exchange(rank_, mine);
    std::vector<std::pair<int64_t, int64_t>> members; // (key, rank) of my color
    for (int64_t r = 0; r < size(); ++r) {
      int64_t theirColor, theirKey;
      std::memcpy(&theirColor, all[r].data(), 8);
      std::memcpy(&theirKey, all[r].data() + 8, 8);
      if (theirColor == color)
        members.push_back({theirKey, r});
    }
    std::sort(members.begin(), members.end());
    int64_t childRank =
        std::find(members.begin(), members.end(), std::make_pair(key, rank_)) - members.begin();
    std::shared_ptr<ThreadGroupState> child =
        state_->child(splits_++, color, static_cast<int64_t>(members.size()));
    return std::unique_ptr<Communicator>(new ThreadCommunicator(std::move(child), childRank));
  }

private:
  std::shared_ptr<ThreadGroupState> state_;
  int64_t rank_;
  uint64_t splits_ = 0; // every rank splits in the same order
};

} // namespace

std::unique_ptr<Communicator> createSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

Result<std::unique_ptr<Communicator>> createCallbackCommunicator(CommunicatorCallbacks callbacks) {
  if (callbacks.size < 1 || callbacks.rank < 0 || callbacks.rank >= callbacks.size)
    return makeError("communicator callbacks: rank " + std::to_string(callbacks.rank) +
                         " of a group of " + std::to_string(callbacks.size),
                     ErrorKind::InvalidArgument);
  if (!callbacks.gather || !callbacks.broadcast || !callbacks.barrier)
    return makeError("communicator callbacks: gather, broadcast and barrier are required",
                     ErrorKind::InvalidArgument);
  return std::unique_ptr<Communicator>(new CallbackCommunicator(std::move(callbacks)));
}

std::vector<std::unique_ptr<Communicator>> createThreadGroup(int64_t size) {
  auto state = std::make_shared<ThreadGroupState>(size);
  std::vector<std::unique_ptr<Communicator>> ranks;
  for (int64_t rank = 0; rank < size; ++rank)
    ranks.push_back(std::make_unique<ThreadCommunicator>(state, rank));
  return ranks;
}

Result<std::unique_ptr<Communicator>> createDefaultCommunicator(int *argc, char ***argv) {
  if (launchedByMpi())
    return createMpiCommunicator(argc, argv);
  return createSingleProcessCommunicator();
}

bool launchedByMpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}

int localRankDevice(int deviceCount) {
  if (deviceCount <= 0)
    return 0;
  for (const char *name : {"OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", "MPI_LOCALRANKID"})
    if (const char *text = std::getenv(name)) {
      char *end = nullptr;
      long rank = std::strtol(text, &end, 10);
      if (*text && !*end && rank >= 0)
        return static_cast<int>(rank % deviceCount);
    }
  return 0;
}

} // namespace runtime
} // namespace fsdp
