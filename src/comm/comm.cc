// The defaults of Comm's optional collectives, built on AllGather and
// Broadcast for backends that do not provide their own.
#include <algorithm>
#include <cstring>

#include "shardsafe/comm.h"
#include "comm/gathered_max.h"
#include "comm/wire.h"

namespace shardsafe {

Result<std::vector<std::string>> Comm::Gather(std::string_view mine, int root) {
  if (root < 0 || root >= size()) {
    return InvalidArgumentError("gather root " + std::to_string(root) +
                                " is not a rank of a group of " + std::to_string(size()));
  }
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGather(mine));
  if (rank() != root) all.clear();
  return all;
}

Result<std::string> Comm::Scatter(const std::vector<std::string>& parts, int root) {
  wire::Writer w;
  if (rank() == root) {
    w.Status(CheckScatterParts(parts, size()));
    for (const std::string& p : parts) w.Str(p);
  }
  SS_ASSIGN_OR_RETURN(std::string all, Broadcast(w.Take(), root));
  wire::Reader r(all);
  Status sent;
  SS_RETURN_IF_ERROR(r.Status(&sent));
  SS_RETURN_IF_ERROR(sent);
  std::string mine;
  for (int i = 0; i <= rank(); ++i) {
    SS_ASSIGN_OR_RETURN(mine, r.Str());
  }
  return mine;
}

Result<std::vector<std::string>> Comm::AllToAll(const std::vector<std::string>& parts) {
  wire::Writer w;
  w.Status(CheckAllToAllParts(parts, size()));
  if (static_cast<int>(parts.size()) == size()) {
    for (const std::string& p : parts) w.Str(p);
  }
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGather(w.Take()));
  std::vector<std::string> mine;
  for (const std::string& from : all) {
    wire::Reader r(from);
    Status sent;
    SS_RETURN_IF_ERROR(r.Status(&sent));
    SS_RETURN_IF_ERROR(sent);
    for (int i = 0; i <= rank(); ++i) {
      SS_ASSIGN_OR_RETURN(std::string part, r.Str());
      if (i == rank()) mine.push_back(std::move(part));
    }
  }
  return mine;
}

Result<std::vector<uint64_t>> Comm::AllReduceMax(std::span<const uint64_t> values) {
  SS_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGather(PackValues(values)));
  return MaxOfGathered(all);
}

std::string PackValues(std::span<const uint64_t> values) {
  std::string bytes(values.size_bytes(), '\0');
  if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

Status CheckScatterParts(const std::vector<std::string>& parts, int size) {
  if (static_cast<int>(parts.size()) == size) return Status();
  return InvalidArgumentError("Scatter: " + std::to_string(parts.size()) + " parts for a group of " +
                              std::to_string(size));
}

Status CheckAllToAllParts(const std::vector<std::string>& parts, int size) {
  if (static_cast<int>(parts.size()) == size) return Status();
  return InvalidArgumentError("AllToAll: " + std::to_string(parts.size()) +
                              " parts for a group of " + std::to_string(size));
}

Result<std::vector<uint64_t>> MaxOfGathered(const std::vector<std::string>& gathered) {
  std::vector<uint64_t> out;
  for (size_t r = 0; r < gathered.size(); ++r) {
    const std::string& bytes = gathered[r];
    if (r == 0) out.assign(bytes.size() / sizeof(uint64_t), 0);
    if (bytes.size() != out.size() * sizeof(uint64_t)) {
      return InvalidArgumentError("AllReduceMax: rank " + std::to_string(r) + " passed " +
                                  std::to_string(bytes.size() / sizeof(uint64_t)) +
                                  " values, rank 0 " + std::to_string(out.size()));
    }
    for (size_t i = 0; i < out.size(); ++i) {
      uint64_t v;
      std::memcpy(&v, bytes.data() + i * sizeof v, sizeof v);
      out[i] = std::max(out[i], v);
    }
  }
  return out;
}

}  // namespace shardsafe
